// One rollout: waves with progress, each gate's value against its threshold, devices per state, and the
// operator's pause / resume / abort / retry-failed (asked for confirmation; the server checks the role anyway).

import { fill, fmtNumber, fmtTime, h, pill, progress } from "./dom.js";

export const NAV = "rollouts";
export const PAGE = "rollout";
export const TITLE = "Rollout";

// Which action applies in which status (edgectl.controller.lifecycle.REQUESTS); the server refuses the rest.
const ACTIONS = [
  { name: "pause", label: "Pause", when: ["running"], text: "Devices already installing finish; no new wave starts." },
  { name: "resume", label: "Resume", when: ["paused"], text: "The rollout continues with the current wave." },
  { name: "retry-failed", label: "Retry failed", when: ["running", "paused", "done"], text: "Failed devices are sent the update again." },
  { name: "abort", label: "Abort", when: ["running", "paused"], danger: true,
    text: "Devices not yet updated are cancelled and devices that installed roll back to their previous model." },
];
const DEVICE_PAGE = 100;

export async function mount(main, [rolloutId], _params, ctx) {
  const body = h("div#rollout");
  const actions = h("div.actions#rollout-actions");
  fill(main, h("p", h("a", { href: "#/rollouts" }, "← Rollouts")), h("h1", `Rollout ${rolloutId}`), actions, body);
  let shown = DEVICE_PAGE;
  let stateFilter = "";
  let last = null;
  const redraw = () => last && draw(body, last, { shown, stateFilter,
    more: () => { shown += DEVICE_PAGE; redraw(); },
    filter: (s) => { stateFilter = s === stateFilter ? "" : s; shown = DEVICE_PAGE; redraw(); } });
  const refresh = async () => {
    last = await ctx.api(`/rollouts/${encodeURIComponent(rolloutId)}`);
    drawActions(actions, last, ctx, refresh);
    redraw();
  };
  await refresh();
  return { refresh };
}

function drawActions(el, r, ctx, refresh) {
  const allowed = ctx.can("operator");
  fill(el, ACTIONS.map((a) => h(`button${a.danger ? ".danger" : ""}`, {
    type: "button", dataset: { action: a.name },
    disabled: !allowed || !a.when.includes(r.status),
    title: allowed ? "" : "viewers cannot steer rollouts",
    onclick: async () => {
      const ok = await ctx.confirm(`${a.label} rollout ${r.id}?`, a.text, a.label);
      if (!ok) return;
      try {
        await ctx.api(`/rollouts/${encodeURIComponent(r.id)}/${a.name}`, { method: "POST" });
        ctx.flash(`${a.label} requested: the controller applies it within a tick.`, "info");
        await refresh();
      } catch (err) {
        ctx.flash(err.message);
      }
    },
  }, a.label)),
  allowed ? null : h("span.muted", "Your role (viewer) can watch but not steer rollouts."));
}

/** Per-wave counts: from the server's ``progress`` (one entry per wave) when it sends one, else counted from the devices. */
function waves(r) {
  if (Array.isArray(r.progress)) {
    return r.progress.map((w) => ({ wave: w.wave, total: w.devices, ok: w.ok, failed: w.failed,
      in_flight: w.devices - w.finished, state: w.state }));
  }
  const byWave = new Map();
  for (const d of r.devices || []) {
    if (!d.wave) continue;
    const w = byWave.get(d.wave) || { wave: d.wave, total: 0, ok: 0, failed: 0, in_flight: 0 };
    w.total += 1;
    if (d.status === "ok") w.ok += 1;
    else if (["failed", "rolled-back", "rollback-sent"].includes(d.status)) w.failed += 1;
    else if (["sent", "running"].includes(d.status)) w.in_flight += 1;
    byWave.set(d.wave, w);
  }
  return [...byWave.values()].sort((a, b) => a.wave - b.wave);
}

function byState(r) {
  if (r.device_states) return r.device_states;
  const counts = {};
  for (const d of r.devices || []) counts[d.status] = (counts[d.status] || 0) + 1;
  for (const s of r.skipped || []) if (!(r.devices || []).some((d) => d.device_id === s.device_id)) counts.skipped = (counts.skipped || 0) + 1;
  return counts;
}

function draw(body, r, view) {
  const states = byState(r);
  const devices = (r.devices || []).filter((d) => !view.stateFilter || d.status === view.stateFilter);
  fill(body,
    h("div.grid2",
      h("section.panel",
        h("dl.facts",
          h("dt", "Status"), h("dd#rollout-status", { dataset: { status: r.status } }, pill(r.status)),
          h("dt", "Wave"), h("dd", `${r.wave} of ${r.waves} (${r.phase})`),
          h("dt", "Packages"), h("dd", (r.packages || []).join(", ")),
          h("dt", "Selector"), h("dd", h("code", r.selector || "all")),
          h("dt", "Max failure"), h("dd", `${fmtNumber(100 * (r.max_failure || 0))} % of a wave`),
          h("dt", "Bake"), h("dd", `${fmtNumber(r.bake_s, 0)} s`),
          h("dt", "Created"), h("dd", fmtTime(r.created)),
          h("dt", "Reason"), h("dd#rollout-reason", r.reason || "–"))),
      h("section.panel", h("h2", "Waves"), waveTable(r))),
    h("div.grid2",
      h("section.panel", h("h2", "Gates"), gateTable(r)),
      h("section.panel", h("h2", "Devices per state"),
        h("div.states#device-states", Object.entries(states).sort().map(([s, n]) => h("button.link-state", {
          type: "button", dataset: { state: s }, "aria-pressed": String(view.stateFilter === s), onclick: () => view.filter(s),
        }, pill(s), ` ${n}`))))),
    h("h2", view.stateFilter ? `Devices (${view.stateFilter})` : "Devices"),
    h("table#rollout-devices",
      h("thead", h("tr", ["Device", "Wave", "Status", "Step", "Package", "Backend", "p95 (ms)", "Detail"].map((c) => h("th", c)))),
      h("tbody", devices.slice(0, view.shown).map((d) => h("tr", { dataset: { device: d.device_id } },
        h("td", h("a", { href: `#/devices/${encodeURIComponent(d.device_id)}` }, d.device_id)),
        h("td", d.wave || "–"),
        h("td", pill(d.status)),
        h("td", d.state || "–"),
        h("td", d.variant || "–"),
        h("td", (d.backend || "–").replace(/^onnxruntime\//, "")),
        h("td", fmtNumber(d.health_p95_ms, 2)),
        h("td.wrap", d.detail || ""))))),
    devices.length > view.shown
      ? h("p", h("button", { type: "button", onclick: view.more }, `Show more (${devices.length - view.shown} left)`)) : null);
}

function waveTable(r) {
  const rows = waves(r);
  if (!rows.length) return h("p.muted", "No device planned.");
  return h("table#waves",
    h("thead", h("tr", h("th", "Wave"), h("th", "Devices"), h("th", "Progress"), h("th", "OK"), h("th", "Failed"), h("th", "Installing"))),
    h("tbody", rows.map((w) => h(`tr${w.wave === r.wave ? ".current" : ""}`, { dataset: { wave: w.wave } },
      h("td", w.wave === r.wave ? h("strong", `${w.wave} ◂`) : String(w.wave)),
      h("td", w.total),
      h("td", progress(w.ok, w.total, w.failed)),
      h("td", w.ok), h("td", w.failed), h("td", w.in_flight ?? "–")))));
}

/** The threshold as the operator wrote it: thresholds arrive in base units (fraction, seconds, ratio, ms). */
function threshold(g) {
  if (g.threshold === undefined || g.threshold === null) return "–";
  const op = g.op ? `${g.op} ` : "";
  if (g.unit === "%") return `${op}${fmtNumber(100 * g.threshold, 2)} %`;
  if (g.unit === "m" || g.unit === "h") return `${op}${fmtNumber(g.threshold, 0)} s`;
  return `${op}${fmtNumber(g.threshold, 4)}${g.unit ? ` ${g.unit}` : ""}`;
}

/** A gate's value in the threshold's units. */
function gateValue(g) {
  if (g.value === null || g.value === undefined) return "–";
  if (g.unit === "%") return `${fmtNumber(100 * g.value, 2)} %`;
  if (g.unit === "m" || g.unit === "h") return `${fmtNumber(g.value, 0)} s`;
  return `${fmtNumber(g.value, 4)}${g.unit ? ` ${g.unit}` : ""}`;
}

function gateTable(r) {
  const gates = (r.gate_values || r.gates || []).map((g) => (typeof g === "string" ? { gate: g } : g));
  if (!gates.length) return h("p.muted", "No gate.");
  return h("table#gates",
    h("thead", h("tr", h("th", "Gate"), h("th", "Value now"), h("th", "Threshold"), h("th", "Verdict"), h("th", "Detail"))),
    h("tbody", gates.map((g) => {
      const verdict = g.value === null || g.value === undefined ? "no data" : g.holds ? "pass" : "fail";
      return h(`tr${verdict === "fail" ? ".gate-fail" : ""}`, { dataset: { gate: g.gate } },
        h("td", h("code", g.gate)),
        h("td", gateValue(g)),
        h("td", threshold(g)),
        h("td", pill(verdict)),
        h("td.wrap", g.detail || ""));
    })));
}
