// The device page's Configuration panel: the desired version and settings beside what the device reports of it.

import { fill, fmtTime, h, pill } from "./dom.js";

/** The panel, and ``refresh`` that reads ``GET /devices/{id}/config`` again (the page calls it on each refresh). */
export function configPanel(deviceId, ctx) {
  const path = `/devices/${encodeURIComponent(deviceId)}/config`;
  const body = h("div#config-body", h("p.muted", "Loading…"));
  const panel = h("section.panel#device-config", h("h2", "Configuration"), body);
  const refresh = async () => {
    try {
      draw(body, await ctx.api(path));
    } catch (err) {
      fill(body, h("p.error", err.message));
    }
  };
  return { panel, refresh };
}

function draw(body, view) {
  const desired = view.desired;
  const reported = view.reported;
  const settings = desired ? Object.entries(desired.settings).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ") : "";
  fill(body, h("dl.facts",
    h("dt", "Sync"), h("dd#config-sync", pill(view.sync)),
    h("dt", "Desired"), h("dd#config-desired", desired
      ? `v${desired.version}: ${settings || "agent.yaml alone"} (by ${desired.updated_by || "–"}, ${fmtTime(desired.updated_at)})`
      : "none: agent.yaml alone"),
    h("dt", "Reported"), h("dd#config-reported", reported
      ? `v${reported.version} ${reported.status}; in force: `
        + (reported.applied_version ? `v${reported.applied_version}` : "agent.yaml alone")
      : "nothing reported (unknown)"),
    reported && reported.reason ? [h("dt", "Reason"), h("dd#config-reason", reported.reason)] : null));
}
