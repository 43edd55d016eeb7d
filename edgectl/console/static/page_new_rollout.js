// Start a rollout: packages (one per target variant), selector or device group, waves, failure budget, bake, gates, shadow.
// A group (group:NAME) is resolved when the rollout is recorded: the rollout keeps the devices it had then.
// "Preview" asks the server for a dry run (the plan, nothing recorded); "Start" records it for the controller: at once,
// or scheduled for a start time (this browser's local time, sent with its offset). A rollout to a protected group, or
// above the configured size, waits for a second operator's approval on its page. Devices of groups with maintenance
// windows install inside them, in their own local time, until the optional forced-update deadline.

import { fill, fmtBytes, h } from "./dom.js";

export const NAV = "rollouts";
export const PAGE = "rollout-new";
export const TITLE = "New rollout";

export async function mount(main, _args, params, ctx) {
  if (!ctx.can("operator")) {
    fill(main, h("h1", "New rollout"), h("p.muted", "Only operators and admins start rollouts."));
    return {};
  }
  const [list, groupList] = await Promise.all([ctx.api("/packages"), ctx.api("/groups")]);
  const packages = list.packages || [];
  const selector = h("input", { name: "selector", value: params.get("selector") || "all",
    placeholder: "all, target=nnapi, group:NAME" });
  const groupPick = h("select#group-pick", { onchange: () => { if (groupPick.value) selector.value = `group:${groupPick.value}`; } },
    h("option", { value: "" }, "—"),
    (groupList.groups || []).map((g) => h("option", { value: g.name }, `${g.name} (${g.kind}${g.protected ? ", protected" : ""}${(g.windows || []).length ? ", windows" : ""}, ${g.resolved ?? "?"} now)`)));
  const preselected = new Set(params.getAll("package"));
  const plan = h("div.plan#plan");
  const form = h("form.stack.panel#rollout-form", { onsubmit: (e) => e.preventDefault() },
    h("fieldset.checks#packages",
      h("legend", "Packages (one per target; each device gets the variant for its target)"),
      packages.length ? packages.map((p) => h("label",
        h("input", { type: "checkbox", name: "packages", value: p.variant, checked: preselected.has(p.variant) }),
        `${p.label} · ${fmtBytes(p.size)}`)) : h("p.muted", "No package yet: upload one on the Packages page.")),
    h("div.row",
      h("label", "Devices (selector)", selector),
      h("label", "or a device group", groupPick),
      h("label", "Waves", h("input", { name: "waves", value: "1,10%,50%,100%" }))),
    h("div.row",
      h("label", "Max failure per wave", h("input", { name: "max_failure", value: "5%" })),
      h("label", "Bake after each wave", h("input", { name: "bake", value: "10m" })),
      h("label", "Start at (optional, your local time)", h("input#start-at", { type: "datetime-local", name: "start_at" })),
      h("label", { title: "From then on the maintenance windows of the devices' groups no longer hold them back" },
        "Forced-update deadline (optional)", h("input#deadline", { type: "datetime-local", name: "deadline" }))),
    h("label", "Gates (one per line, e.g. p95_latency <= 1.2x)", h("textarea", { name: "gates", rows: 3 })),
    h("div.row.checks",
      h("label", h("input", { type: "checkbox", name: "shadow" }), "Shadow run (compare against the old model first)"),
      h("label", h("input", { type: "checkbox", name: "allow_downgrade" }), "Allow downgrade"),
      h("label", { title: "Without it a wave whose gate has no data (no latency baseline, no requests) waits for data, then halts" },
        h("input", { type: "checkbox", name: "allow_no_data" }), "Promote without data")),
    h("div.actions",
      h("button#preview", { type: "button", onclick: () => submit(true) }, "Preview (dry run)"),
      h("button.primary#start", { type: "button", onclick: () => submit(false) }, "Start rollout")));
  fill(main, h("p", h("a", { href: "#/rollouts" }, "← Rollouts")), h("h1", "New rollout"), form, plan);

  async function submit(dryRun) {
    const data = new FormData(form);
    const body = {
      packages: data.getAll("packages").map(String),
      selector: String(data.get("selector") || "all").trim(),
      waves: String(data.get("waves") || "").trim(),
      max_failure: String(data.get("max_failure") || "").trim(),
      bake: String(data.get("bake") || "").trim(),
      gates: String(data.get("gates") || "").split("\n").map((g) => g.trim()).filter(Boolean),
      shadow: data.get("shadow") === "on",
      allow_downgrade: data.get("allow_downgrade") === "on",
      allow_no_data: data.get("allow_no_data") === "on",
      dry_run: dryRun,
    };
    const startAt = String(data.get("start_at") || "");
    if (startAt) body.start_at = new Date(startAt).toISOString(); // UTC with its offset (Z): one instant everywhere
    const deadline = String(data.get("deadline") || "");
    if (deadline) body.deadline = new Date(deadline).toISOString();
    if (!body.packages.length) {
      ctx.flash("Choose at least one package.");
      return;
    }
    ctx.flash("");
    try {
      const result = await ctx.api("/rollouts", { method: "POST", body });
      if (dryRun) drawPlan(plan, result);
      else ctx.go(`#/rollouts/${encodeURIComponent(result.rollout_id)}`);
    } catch (err) {
      ctx.flash(err.message);
    }
  }
  return {};
}

function drawPlan(el, result) {
  const p = result.plan;
  const waves = p.waves || [];
  fill(el, h("section.panel",
    h("h2", "Plan (dry run: nothing recorded)"),
    h("p.muted", `${fmtBytes(p.total_bytes)} to send; about ${Math.round(p.estimated_s)} s with ${p.bake_s} s bake per wave.`),
    h("table",
      h("thead", h("tr", h("th", "Wave"), h("th", "Devices"))),
      h("tbody", waves.map((w, i) => h("tr", h("td", w.wave ?? i + 1),
        h("td.wrap", `${w.devices.length}: ${w.devices.slice(0, 12).map((d) => d.device_id).join(", ")}`
          + (w.devices.length > 12 ? " …" : "")))))),
    (p.skipped || []).length ? h("p.muted", `Skipped: ${p.skipped.map((s) => `${s.device_id} (${s.reason})`).join("; ")}`) : null));
}
