// One device: model and backend, latency p50/p95, CPU, memory and inference-rate charts, events timeline.

import { lineChart } from "./charts.js";
import { configPanel } from "./device_config.js";
import { logsPanel } from "./device_logs.js";
import { fill, fmtAgo, fmtBytes, fmtNumber, fmtTime, h, pill } from "./dom.js";

export const NAV = "devices";
export const PAGE = "device";
export const TITLE = "Device";
const KEEP = 300; // telemetry samples kept for the charts

export async function mount(main, [deviceId], _params, ctx) {
  const samples = new Map(); // ts -> point: the API's telemetry history, then each report seen while the page is open
  const body = h("div#device");
  const config = configPanel(deviceId, ctx);
  fill(main, h("p", h("a", { href: "#/devices" }, "← Devices")), h("h1", deviceId), body, config.panel,
    logsPanel(deviceId, ctx));
  const refresh = async () => {
    config.refresh();
    const d = await ctx.api(`/devices/${encodeURIComponent(deviceId)}`);
    for (const p of d.telemetry_history || []) if (typeof p.ts === "number") samples.set(p.ts, fromHistory(p));
    const r = d.telemetry;
    if (r && typeof r.ts === "number" && !samples.has(r.ts)) samples.set(r.ts, fromReport(r, d.model, samples));
    while (samples.size > KEEP) samples.delete(samples.keys().next().value);
    draw(body, d, [...samples.values()].sort((a, b) => a.ts - b.ts), actions(d, ctx, refresh));
  };
  await refresh();
  return { refresh };
}

/** A point of the API's ``telemetry_history`` (the store computed the rate). */
function fromHistory(p) {
  return { ts: p.ts, p50: p.p50_ms, p95: p.p95_ms, cpu: p.cpu_percent, mem: p.memory_percent, rate: p.rate_rps,
    requests: p.requests };
}

/** A point of a telemetry report as the agent sent it; the rate from its throughput, or its counter since the last point. */
function fromReport(r, model, samples) {
  const models = r.models || {};
  const m = models[model] || Object.values(models)[0] || {};
  const lat = m.latency_ms || {};
  const dev = r.device || {};
  const before = [...samples.values()].filter((p) => p.ts < r.ts).sort((a, b) => b.ts - a.ts)[0];
  let rate = m.throughput_rps;
  if (!Number.isFinite(rate) && before && Number.isFinite(m.requests) && Number.isFinite(before.requests)) {
    rate = m.requests >= before.requests ? (m.requests - before.requests) / (r.ts - before.ts) : null;
  }
  return { ts: r.ts, p50: lat.p50, p95: lat.p95, cpu: dev.cpu_percent, mem: dev.memory_percent, rate, requests: m.requests };
}

function series(points, d) {
  const pick = (key) => points.filter((p) => Number.isFinite(p[key])).map((p) => [p.ts, p[key]]);
  const p95 = pick("p95");
  // Health checks (p95 only) join the telemetry; without telemetry history, the store's p95 points stand for it.
  const telemetry = p95.length > 0;
  for (const point of d.latency || []) {
    const wanted = point.source === "health" || !telemetry;
    if (wanted && (!d.model || point.model === d.model)) p95.push([point.ts, point.p95_ms]);
  }
  p95.sort((a, b) => a[0] - b[0]);
  return { p50: pick("p50"), p95, cpu: pick("cpu"), mem: pick("mem"), rate: pick("rate") };
}

/** Decommission (operators; asks first) and, once decommissioned, delete (admins): the device's lifecycle. */
function actions(d, ctx, refresh) {
  const id = encodeURIComponent(d.device_id);
  if (d.decommissioned === null || d.decommissioned === undefined) {
    if (!ctx.can("operator")) return null;
    return h("p.actions", h("button.danger#decommission", { type: "button", onclick: async () => {
      const ok = await ctx.confirm(`Decommission ${d.device_id}?`, "Its certificate is revoked where this server holds the "
        + "fleet CA, its desired state is cleared on the broker, and its reports are dropped from now on. It stays listed "
        + "for history; this cannot be undone.", "Decommission");
      if (!ok) return;
      try {
        const done = await ctx.api(`/devices/${id}/decommission`, { method: "POST" });
        ctx.flash(`${d.device_id} decommissioned; certificate: ${done.certificate}.`, "info");
        await refresh();
      } catch (err) { ctx.flash(err.message); }
    } }, "Decommission…"));
  }
  if (!ctx.can("admin")) return null;
  return h("p.actions", h("button.danger#delete-device", { type: "button", onclick: async () => {
    const ok = await ctx.confirm(`Delete ${d.device_id}?`, "Its record, served models and telemetry history are removed; "
      + "its rollout rows and audit entries stay.", "Delete");
    if (!ok) return;
    try {
      await ctx.api(`/devices/${id}`, { method: "DELETE" });
      ctx.flash(`${d.device_id} deleted.`, "info");
      ctx.go("#/devices");
    } catch (err) { ctx.flash(err.message); }
  } }, "Delete…"));
}

function draw(body, d, reports, controls) {
  const s = series(reports, d);
  const hw = d.hardware || {};
  const latest = (d.telemetry && d.telemetry.device) || {};
  fill(body,
    h("div.grid2",
      h("section.panel",
        h("h2", "Device"),
        h("dl.facts",
          h("dt", "Status"), h("dd#device-status", d.decommissioned ? pill("decommissioned") : pill(d.status)),
          d.decommissioned ? [h("dt", "Decommissioned"), h("dd#device-decommissioned", fmtTime(d.decommissioned))] : null,
          h("dt", "Target"), h("dd", d.target || "–"),
          h("dt", "Model"), h("dd#device-model", d.model ? `${d.model} v${d.version}` : "none"),
          h("dt", "Backend"), h("dd#device-backend", d.backend || "–"),
          h("dt", "Deployment"), h("dd", d.deployment ? JSON.stringify(d.deployment) : "–"),
          h("dt", "Agent"), h("dd", d.agent_version || "–"),
          h("dt", "Tags"), h("dd", Object.entries(d.tags || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "–"),
          h("dt", "Hardware"), h("dd", hardwareLine(hw)),
          h("dt", "Memory"), h("dd", latest.memory_total_bytes
            ? `${fmtBytes(latest.memory_used_bytes)} of ${fmtBytes(latest.memory_total_bytes)}` : "–"),
          h("dt", "Inference URL"), h("dd", d.inference_url || "–"),
          h("dt", "Last seen"), h("dd", `${fmtAgo(d.last_seen)} (${fmtTime(d.last_seen)})`)),
        controls),
      h("section.panel", h("h2", "Events"), timeline(d))),
    modelsPanel(d.models || []),
    h("div.charts",
      h("section.panel", lineChart("Inference latency", [{ name: "p50", points: s.p50 }, { name: "p95", points: s.p95 }], "ms")),
      h("section.panel", lineChart("Inference rate", [{ name: "requests/s", points: s.rate }], "req/s")),
      h("section.panel", lineChart("CPU", [{ name: "cpu", points: s.cpu }], "%", { yMax: 100 })),
      h("section.panel", lineChart("Memory", [{ name: "memory", points: s.mem }], "%", { yMax: 100 }))));
}

/** Every model and pipeline the device serves, with its version, backend and latest figures (the API's ``models``). */
function modelsPanel(models) {
  const num = (v, digits) => (Number.isFinite(v) ? v.toFixed(digits) : "–");
  return h("section.panel", h("h2", `Models (${models.length})`),
    h("div.scroll", h("table#device-models",
      h("thead", h("tr", ...["Name", "Kind", "Version", "Backend", "Footprint MB", "p50 ms", "p95 ms", "Requests", "Errors"]
        .map((label) => h("th", label)))),
      h("tbody", ...models.map((m) => h("tr", { "data-model": m.name },
        h("td", m.name), h("td", m.kind || "model"), h("td", `v${m.version}`), h("td", m.backend || "–"),
        h("td", num(m.footprint_mb, 1)), h("td", num(m.p50_ms, 2)), h("td", num(m.p95_ms, 2)),
        h("td", Number.isFinite(m.requests) ? String(m.requests) : "–"),
        h("td", Number.isFinite(m.errors) ? String(m.errors) : "–")))))));
}

function hardwareLine(hw) {
  if (!hw || typeof hw !== "object" || !Object.keys(hw).length) return "–";
  const parts = [];
  if (hw.cpu && hw.cpu.model) parts.push(hw.cpu.model);
  if (hw.memory_mb) parts.push(`${fmtNumber(hw.memory_mb, 0)} MB`);
  if (hw.accelerators && hw.accelerators.length) parts.push(hw.accelerators.map((a) => a.kind || a.name || a).join(", "));
  if (!parts.length) {
    for (const [k, v] of Object.entries(hw)) if (typeof v !== "object") parts.push(`${k} ${v}`);
  }
  return parts.join(" · ") || "–";
}

function timeline(d) {
  const items = [
    ...(d.events || []).map((e) => ({ ts: e.ts, bad: ["failed", "rolled-back", "error"].includes(e.status),
      text: `${e.state} ${e.status}${e.detail ? `: ${e.detail}` : ""}`, rollout: e.deployment_id })),
    ...(d.audit || []).map((a) => ({ ts: a.ts, bad: /fail|roll|abort|halt/i.test(a.action),
      text: `${a.action}${a.detail ? `: ${a.detail}` : ""} (${a.actor})`, rollout: a.rollout_id })),
  ].sort((a, b) => b.ts - a.ts);
  if (!items.length) return h("p.muted", "No events yet.");
  return h("ul.timeline#events", items.slice(0, 100).map((e) => h(`li${e.bad ? ".bad" : ""}`,
    h("time", fmtTime(e.ts)), e.text,
    e.rollout ? [" · ", h("a", { href: `#/rollouts/${encodeURIComponent(e.rollout)}` }, e.rollout)] : null)));
}
