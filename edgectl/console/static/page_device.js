// One device: model and backend, latency p50/p95, CPU, memory and inference-rate charts, events timeline.

import { lineChart } from "./charts.js";
import { fill, fmtAgo, fmtBytes, fmtNumber, fmtTime, h, pill } from "./dom.js";

export const NAV = "devices";
export const PAGE = "device";
export const TITLE = "Device";
const KEEP = 300; // telemetry samples kept for the charts

export async function mount(main, [deviceId], _params, ctx) {
  const samples = new Map(); // ts -> telemetry report
  const body = h("div#device");
  fill(main, h("p", h("a", { href: "#/devices" }, "← Devices")), h("h1", deviceId), body);
  const refresh = async () => {
    const d = await ctx.api(`/devices/${encodeURIComponent(deviceId)}`);
    for (const report of [...(d.telemetry_history || []), d.telemetry]) {
      if (report && typeof report.ts === "number") samples.set(report.ts, report);
    }
    while (samples.size > KEEP) samples.delete(samples.keys().next().value);
    draw(body, d, [...samples.values()].sort((a, b) => a.ts - b.ts));
  };
  await refresh();
  return { refresh };
}

function modelStats(report, name) {
  const models = report.models || {};
  return models[name] || Object.values(models)[0] || null;
}

function series(reports, d) {
  const p50 = [], p95 = [], cpu = [], mem = [], rate = [];
  let prev = null;
  for (const r of reports) {
    const m = modelStats(r, d.model);
    const lat = (m && m.latency_ms) || {};
    if (Number.isFinite(lat.p50)) p50.push([r.ts, lat.p50]);
    if (Number.isFinite(lat.p95)) p95.push([r.ts, lat.p95]);
    const dev = r.device || {};
    if (Number.isFinite(dev.cpu_percent)) cpu.push([r.ts, dev.cpu_percent]);
    if (Number.isFinite(dev.memory_percent)) mem.push([r.ts, dev.memory_percent]);
    if (m && Number.isFinite(m.throughput_rps)) rate.push([r.ts, m.throughput_rps]);
    else if (m && prev && Number.isFinite(m.requests) && Number.isFinite(prev.requests) && r.ts > prev.ts) {
      rate.push([r.ts, Math.max(0, (m.requests - prev.requests) / (r.ts - prev.ts))]);
    }
    prev = m ? { requests: m.requests, ts: r.ts } : null;
  }
  // Health checks and older telemetry points the store kept (p95 only) fill the p95 history.
  const known = new Set(p95.map((p) => p[0]));
  for (const point of d.latency || []) {
    if (!known.has(point.ts) && (!d.model || point.model === d.model)) p95.push([point.ts, point.p95_ms]);
  }
  p95.sort((a, b) => a[0] - b[0]);
  return { p50, p95, cpu, mem, rate };
}

function draw(body, d, reports) {
  const s = series(reports, d);
  const hw = d.hardware || {};
  const latest = (d.telemetry && d.telemetry.device) || {};
  fill(body,
    h("div.grid2",
      h("section.panel",
        h("h2", "Device"),
        h("dl.facts",
          h("dt", "Status"), h("dd", pill(d.status)),
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
          h("dt", "Last seen"), h("dd", `${fmtAgo(d.last_seen)} (${fmtTime(d.last_seen)})`))),
      h("section.panel", h("h2", "Events"), timeline(d))),
    h("div.charts",
      h("section.panel", lineChart("Inference latency", [{ name: "p50", points: s.p50 }, { name: "p95", points: s.p95 }], "ms")),
      h("section.panel", lineChart("Inference rate", [{ name: "requests/s", points: s.rate }], "req/s")),
      h("section.panel", lineChart("CPU", [{ name: "cpu", points: s.cpu }], "%", { yMax: 100 })),
      h("section.panel", lineChart("Memory", [{ name: "memory", points: s.mem }], "%", { yMax: 100 }))));
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
