// The device page's Configuration panel: the desired version and settings beside what the device reports of it, and
// for operators an editor of the next version (its settings as JSON: the keys docs/protocol.md lists; a bad key or
// value is refused by the server, naming it, and nothing is stored).

import { fill, fmtTime, h, pill } from "./dom.js";

const KEYS = "telemetry_interval_s, log_level, tags, inference.max_queue, maintenance_windows";

/** A settings editor's submit: the textarea's JSON to ``put`` (bad JSON refused here, the server's refusal flashed). */
export async function saveSettings(event, text, ctx, put) {
  event.preventDefault();
  let settings;
  try {
    settings = JSON.parse(text.value || "{}");
  } catch (err) {
    ctx.flash(`settings: not valid JSON (${err.message})`);
    return;
  }
  try {
    await put(settings);
  } catch (err) {
    ctx.flash(err.message);
  }
}

/** The panel, and ``refresh`` that reads ``GET /devices/{id}/config`` again (the page calls it on each refresh). */
export function configPanel(deviceId, ctx) {
  const path = `/devices/${encodeURIComponent(deviceId)}/config`;
  const body = h("div#config-body", h("p.muted", "Loading…"));
  let loaded = null;
  const refresh = async () => {
    try {
      loaded = await ctx.api(path);
      draw(body, loaded);
      if (editor && !editor.dataset.filled) fillEditor(loaded);
    } catch (err) {
      fill(body, h("p.error", err.message));
    }
  };
  const text = h("textarea#config-input", { name: "settings", rows: 3, spellcheck: "false" });
  const fillEditor = (view) => {
    text.value = JSON.stringify(view.desired ? view.desired.settings : {});
    editor.dataset.filled = "yes";
  };
  // Drawn once: a refresh redraws the facts above it, never the field being typed in.
  const editor = !ctx.can("operator") ? null : h("form.stack#config-form", {
    onsubmit: (event) => saveSettings(event, text, ctx, async (settings) => {
      await ctx.api(path, { method: "PUT", body: { settings } });
      ctx.flash("");
      await refresh();
    }),
  }, h("label", `Next version's settings, JSON (keys: ${KEYS}; a key left out goes back to agent.yaml)`, text),
  h("button.primary#config-save", { type: "submit" }, "Save as next version"));
  const panel = h("section.panel#device-config", h("h2", "Configuration"), body, editor);
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
