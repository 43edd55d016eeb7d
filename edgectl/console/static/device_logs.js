// The device page's Logs panel: ask the device for its recent log lines (operators), show the latest answer.

import { fill, fmtTime, h } from "./dom.js";

const LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"];

/** A panel that outlives the page's refreshes: it is drawn once, and again only when logs are fetched. */
export function logsPanel(deviceId, ctx) {
  const path = `/devices/${encodeURIComponent(deviceId)}/logs`;
  const out = h("div#logs-out");
  const status = h("p.muted#logs-status");
  if (!ctx.can("operator")) {
    return h("section.panel#logs", h("h2", "Logs"), h("p.muted", "Reading a device's logs needs the operator role."));
  }
  const lines = h("input", { name: "lines", type: "number", min: 1, max: 1000, value: 100 });
  const level = h("select", { name: "level" }, ...LEVELS.map((l) => h("option", { value: l, selected: l === "INFO" }, l)));
  const button = h("button#fetch-logs", { type: "submit" }, "Fetch logs");
  const form = h("form.inline#logs-form", { onsubmit: async (event) => {
    event.preventDefault();
    button.disabled = true;
    status.textContent = `Asking ${deviceId}… (up to 10 s)`;
    try {
      show(await ctx.api(path, { method: "POST", body: { lines: Number(lines.value), level: level.value } }));
    } catch (err) {
      status.textContent = err.message; // 504: no answer, and whether it was sent; 400: the field
      status.className = "error";
    } finally {
      button.disabled = false;
    }
  } }, h("label", "Lines", lines), h("label", "Level", level), button);
  const show = (answer) => {
    const got = answer.lines || [];
    status.className = "muted";
    status.textContent = `${got.length} line(s), answered ${fmtTime(answer.answered)}; the device holds `
      + (answer.held_since ? `records since ${fmtTime(answer.held_since)}` : "no records")
      + (answer.truncated ? "; older matching lines were left out (64 KiB cap)" : "");
    fill(out, got.length ? h("pre.logs#logs-lines", got.map((l) => `${fmtTime(l.ts)} ${l.level.padEnd(8)} ${l.logger}: `
      + `${l.message}\n`).join("")) : h("p.muted", "No lines matched."));
  };
  ctx.api(path).then(show, (err) => {
    status.textContent = err.status === 404 ? "No logs fetched yet." : err.message;
  });
  return h("section.panel#logs", h("h2", "Logs"), form, status, out);
}
