// One device group: the devices it resolves to now, its members (static) or query (dynamic), its maintenance windows
// (in each device's local time) and protection (rollouts to it need a second operator), a configuration for all its
// devices at once, delete, roll out to it.

import { fill, fmtAgo, h, pill } from "./dom.js";
import { saveSettings } from "./device_config.js";
import { deviceIds } from "./page_groups.js";

export const NAV = "groups";
export const PAGE = "group";
export const TITLE = "Group";

export async function mount(main, [name], _params, ctx) {
  const path = `/groups/${encodeURIComponent(name)}`;
  let group = await ctx.api(path);
  const body = h("div#group");
  const change = async (patch) => {
    try {
      group = await ctx.api(path, { method: "PATCH", body: patch });
      await refresh();
      return true;
    } catch (err) {
      ctx.flash(err.message);
      return false;
    }
  };
  // The editor is drawn once: live updates redraw only what the group resolves to, never a field being typed in.
  const editor = !ctx.can("operator") ? null : group.kind === "static"
    ? memberForm(() => group, (members) => change({ members }))
    : queryForm(group, (query) => change({ query }));
  const remove = async () => {
    if (!(await ctx.confirm(`Delete group ${name}?`, "Rollouts already planned from it keep their devices.", "Delete"))) return;
    try {
      await ctx.api(path, { method: "DELETE" });
      ctx.go("#/groups");
    } catch (err) {
      ctx.flash(err.message);
    }
  };
  const actions = ctx.can("operator") ? h("div.actions",
    h("a#group-rollout", { href: `#/rollouts/new?selector=${encodeURIComponent(`group:${name}`)}` }, "Roll out to this group…"),
    h("button.danger#group-delete", { type: "button", onclick: remove }, "Delete group")) : null;
  const settings = ctx.can("operator") ? settingsForm(group, change) : null;
  const config = ctx.can("operator") ? configForm(path, ctx) : null;
  fill(main, h("p", h("a", { href: "#/groups" }, "← Groups")), h("h1", `Group ${name}`), editor, settings, body, config,
    actions);
  const refresh = async () => {
    group = await ctx.api(path);
    draw(body, group, ctx, (members) => change({ members }));
  };
  draw(body, group, ctx, (members) => change({ members }));
  return { refresh };
}

function draw(el, g, ctx, saveMembers) {
  const devices = g.devices || [];
  const removable = g.kind === "static" && ctx.can("operator");
  fill(el,
    h("p#group-definition", { dataset: { kind: g.kind } },
      g.kind === "dynamic" ? `Dynamic: ${g.query}` : `Static: ${g.members.length} member(s)`,
      g.description ? ` · ${g.description}` : "", ` · created by ${g.created_by || "–"}`),
    h("p#group-windows", (g.windows || []).length
      ? `Installs only inside: ${g.windows.join("; ")} (each device's local time)` : "Maintenance windows: none (installs any time)",
      g.protected ? " · protected: rollouts to it wait for a second operator's approval" : ""),
    g.problem ? h("p.error", `Does not resolve now: ${g.problem}`) : null,
    (g.missing || []).length ? h("p.muted#group-missing", `Members the store no longer holds: ${g.missing.join(", ")}`) : null,
    h("h2", `${devices.length} device(s) now`),
    h("table#group-devices",
      h("thead", h("tr", ["Device", "Status", "Target", "Model", "Last seen", ""].map((c) => h("th", c)))),
      h("tbody", devices.map((d) => h("tr", { dataset: { device: d.device_id } },
        h("td", h("a", { href: `#/devices/${encodeURIComponent(d.device_id)}` }, d.device_id)),
        h("td", pill(d.status)), h("td", d.target || "–"), h("td", d.model ? `${d.model} v${d.version}` : "none"),
        h("td", fmtAgo(d.last_seen)),
        h("td", removable ? h("button.remove-member", { type: "button",
          onclick: () => saveMembers(g.members.filter((m) => m !== d.device_id)) }, "Remove") : ""))))));
}

function memberForm(current, save) {
  const form = h("form.filters#member-form", {
    onsubmit: async (event) => {
      event.preventDefault();
      const { members } = current();
      const added = deviceIds(new FormData(form).get("add"));
      if (!added.length) return;
      if (await save([...members, ...added.filter((d) => !members.includes(d))])) form.reset();
    },
  }, h("label", "Add devices", h("input", { name: "add", size: 30, placeholder: "cam-03, cam-04" })),
  h("button.primary", { type: "submit" }, "Add"));
  return form;
}

function queryForm(g, save) {
  const form = h("form.filters#query-form", {
    onsubmit: (event) => {
      event.preventDefault();
      save(String(new FormData(form).get("query") || "").trim());
    },
  }, h("label", "Query", h("input", { name: "query", size: 40, value: g.query })),
  h("button.primary", { type: "submit" }, "Save query"));
  return form;
}

function settingsForm(g, save) {
  const windows = h("textarea#windows-input", { name: "windows", rows: 2, placeholder: "Mon-Fri 22:00-02:00",
    value: (g.windows || []).join("\n") });
  const protect = h("input#protected-input", { type: "checkbox", name: "protected", checked: g.protected });
  const form = h("form.filters#settings-form", {
    onsubmit: (event) => {
      event.preventDefault();
      save({ windows: windows.value.split("\n").map((w) => w.trim()).filter(Boolean), protected: protect.checked });
    },
  }, h("label", "Maintenance windows, device time (one per line: DAYS HH:MM-HH:MM)", windows),
  h("label", protect, "Protected (two-person rule)"),
  h("button.primary#settings-save", { type: "submit" }, "Save"));
  return form;
}

function configForm(path, ctx) {
  const text = h("textarea#group-config-input", { name: "settings", rows: 2, spellcheck: "false", value: "{}" });
  const form = h("form.stack#group-config-form", {
    onsubmit: (event) => saveSettings(event, text, ctx, async (settings) => {
      const done = await ctx.api(`${path}/config`, { method: "PUT", body: { settings } });
      ctx.flash(`Configuration stored for ${done.devices.length} device(s): `
        + done.devices.map((d) => `${d.device_id} v${d.version}`).join(", "));
    }),
  }, h("h2", "Configure every device of the group"),
  h("label", "Next version's settings for each device it resolves to now, JSON (as on a device's page)", text),
  h("button#group-config-save", { type: "submit" }, "Save for all devices"));
  return form;
}
