// One rollout: waves with progress, each gate's value against its threshold, devices per state, and the
// operator's pause / resume / abort / retry-failed, and a second operator's approve / reject of a rollout awaiting
// approval (asked for confirmation; the server checks the role and the two-person rule anyway).
//
// Live updates change the page in place (dom.update): the buttons and the keyboard focus survive a poll, so
// a click lands on the element the operator aimed at. Controls are handled by delegation on the page.

import { fill, fmtNumber, fmtTime, h, pill, progress, update } from "./dom.js";

export const NAV = "rollouts";
export const PAGE = "rollout";
export const TITLE = "Rollout";

// Which action applies in which status (edgectl.controller.lifecycle.REQUESTS); the server refuses the rest.
const ACTIONS = [
  { name: "pause", label: "Pause", when: ["running"], text: "Devices already installing finish; no new wave starts." },
  { name: "resume", label: "Resume", when: ["paused"], text: "The rollout continues with the current wave." },
  { name: "retry-failed", label: "Retry failed", when: ["running", "paused", "done"], text: "Failed devices are sent the update again." },
  { name: "abort", label: "Abort", when: ["running", "paused", "scheduled", "awaiting-approval"], danger: true,
    text: "Devices not yet updated are cancelled and devices that installed roll back to their previous model." },
  { name: "approve", label: "Approve", when: ["awaiting-approval"],
    text: "It starts at its start time, or at once (two-person rule: you are not its creator)." },
  { name: "reject", label: "Reject", when: ["awaiting-approval"], danger: true,
    text: "It ends rejected with your reason; nothing is sent." },
];
const DEVICE_PAGE = 100;
const PHASES = { start: "starting", installing: "installing", baking: "baking", waiting: "waiting for data", rollback: "rolling back" };
const VERDICTS = { holds: "pass", fails: "fail", "no data": "no data", "not judged": "not judged" };

export async function mount(main, [rolloutId], _params, ctx) {
  const view = { shown: DEVICE_PAGE, stateFilter: "", last: null };
  const body = h("div#rollout");
  const buttons = ACTIONS.map((a) => h(`button${a.danger ? ".danger" : ""}`, { type: "button", dataset: { action: a.name } }, a.label));
  const note = h("span.muted#rollout-role-note");
  const reason = h("input#reject-reason", { type: "text", maxLength: 500, placeholder: "reason to reject",
    "aria-label": "Reason to reject" });
  fill(main, h("p", h("a", { href: "#/rollouts" }, "← Rollouts")), h("h1", `Rollout ${rolloutId}`),
    h("div.actions#rollout-actions", buttons, reason, note), body);
  const redraw = () => view.last && update(body, ...draw(view.last, view));
  const refresh = async () => {
    view.last = await ctx.api(`/rollouts/${encodeURIComponent(rolloutId)}`);
    drawActions(buttons, note, reason, view.last, ctx);
    redraw();
  };
  main.querySelector("#rollout-actions").addEventListener("click", (e) => {
    const button = e.target.closest("button[data-action]");
    if (button && !button.disabled) {
      act(ACTIONS.find((a) => a.name === button.dataset.action), view.last, ctx, refresh, reason);
    }
  });
  body.addEventListener("click", (e) => {
    const state = e.target.closest("button[data-state]");
    if (state) {
      view.stateFilter = state.dataset.state === view.stateFilter ? "" : state.dataset.state;
      view.shown = DEVICE_PAGE;
      redraw();
    } else if (e.target.closest("button[data-more]")) {
      view.shown += DEVICE_PAGE;
      redraw();
    }
  });
  await refresh();
  return { refresh };
}

/** Who an audit actor is (edgectl.fleet.approvals.person): "api:alice" and "cli:alice" are alice. */
function person(actor) {
  const at = (actor || "").indexOf(":");
  return at < 0 ? actor || "" : actor.slice(at + 1);
}

/** The buttons stay; only whether each applies now changes. */
function drawActions(buttons, note, reason, r, ctx) {
  const allowed = ctx.can("operator");
  const mine = Boolean(ctx.session.me && r.created_by && person(r.created_by) === ctx.session.me.user);
  ACTIONS.forEach((a, i) => {
    const own = a.name === "approve" && mine;
    buttons[i].disabled = !allowed || !a.when.includes(r.status) || own;
    buttons[i].title = !allowed ? "viewers cannot steer rollouts"
      : own ? "two-person rule: another operator approves the rollouts you created" : "";
  });
  reason.hidden = r.status !== "awaiting-approval" || !allowed;
  note.textContent = !allowed ? "Your role (viewer) can watch but not steer rollouts."
    : r.status === "awaiting-approval" && mine ? "You created this rollout: another operator approves it (two-person rule)."
      : "";
}

async function act(a, r, ctx, refresh, reason) {
  const why = reason.value.trim();
  if (a.name === "reject" && !why) {
    ctx.flash("Give a reason to reject the rollout.");
    reason.focus();
    return;
  }
  const ok = await ctx.confirm(`${a.label} rollout ${r.id}?`, a.text, a.label);
  if (!ok) return;
  try {
    const body = a.name === "reject" ? { reason: why } : undefined;
    await ctx.api(`/rollouts/${encodeURIComponent(r.id)}/${a.name}`, { method: "POST", body });
    ctx.flash(["approve", "reject"].includes(a.name) ? `Rollout ${a.name === "approve" ? "approved" : "rejected"}.`
      : `${a.label} requested: the controller applies it within a tick.`, "info");
    await refresh();
  } catch (err) {
    ctx.flash(err.message);
  }
}

/** A device status as the operator reads it: a rollback the controller ordered says who ordered it. */
function statusWord(status, r) {
  if (status === "rolled-back" || status === "rollback-sent") {
    const by = byWhom(r);
    if (by) return `${status === "rollback-sent" ? "rolling back" : "rolled back"} by the ${by}`;
  }
  return status;
}

function byWhom(r) {
  if (["aborting", "aborted"].includes(r.status)) return "operator";
  if (["rolling-back", "rolled-back"].includes(r.status)) return "halt";
  return null;
}

function statusPill(status, r) {
  const word = statusWord(status, r);
  const el = pill(status);
  el.textContent = word;
  return el;
}

function byState(r) {
  const counts = {};
  for (const d of r.devices || []) counts[d.status] = (counts[d.status] || 0) + 1;
  return counts;
}

function draw(r, view) {
  const states = byState(r);
  const devices = (r.devices || []).filter((d) => !view.stateFilter || d.status === view.stateFilter);
  return [
    waiting(r),
    h("div.grid2",
      h("section.panel",
        h("dl.facts",
          h("dt", "Status"), h("dd#rollout-status", { dataset: { status: r.status } }, pill(r.status)),
          h("dt", "Wave"), h("dd#rollout-wave", `${r.wave} of ${r.waves} (${PHASES[r.phase] || r.phase})`),
          h("dt", "Packages"), h("dd", (r.packages || []).join(", ")),
          h("dt", "Selector"), h("dd", h("code", r.selector || "all")),
          h("dt", "Max failure"), h("dd", `${fmtNumber(100 * (r.max_failure || 0))} % of a wave`),
          h("dt", "Bake"), h("dd", `${fmtNumber(r.bake_s, 0)} s`),
          h("dt", "No data"), h("dd", r.allow_no_data ? "a wave may be promoted without a gate's data (--allow-no-data)"
            : "a gate without data holds the wave"),
          h("dt", "Created"), h("dd", `${fmtTime(r.created)}${r.created_by ? ` by ${r.created_by}` : ""}`),
          h("dt", "Start"), h("dd#rollout-start", r.start_at ? `at ${r.start_at} (the controller's clock)` : "when recorded"),
          h("dt", "Approval"), h("dd#rollout-approval", r.approval ? `needed: ${r.approval}` : "not needed"),
          h("dt", "Reason"), h("dd#rollout-reason", r.reason || "–"))),
      h("section.panel", h("h2", "Waves"), waveTable(r))),
    h("div.grid2",
      h("section.panel", h("h2", "Gates"), gateTable(r)),
      h("section.panel", h("h2", "Devices per state"),
        h("div.states#device-states", Object.entries(states).sort().map(([s, n]) => h("button.link-state", {
          type: "button", "data-key": s, dataset: { state: s }, "aria-pressed": String(view.stateFilter === s),
        }, statusPill(s, r), ` ${n}`))))),
    h("h2", view.stateFilter ? `Devices (${statusWord(view.stateFilter, r)})` : "Devices"),
    h("div.scroll", h("table#rollout-devices",
      h("thead", h("tr", ["Device", "Wave", "Status", "Step", "Package", "Backend", "p95 (ms)", "Detail"].map((c) => h("th", c)))),
      h("tbody", devices.slice(0, view.shown).map((d) => h("tr", { "data-key": d.device_id, dataset: { device: d.device_id } },
        h("td", h("a", { href: `#/devices/${encodeURIComponent(d.device_id)}` }, d.device_id)),
        h("td", d.wave || "–"),
        h("td", statusPill(d.status, r)),
        h("td", d.state || "–"),
        h("td", d.variant || "–"),
        h("td", (d.backend || "–").replace(/^onnxruntime\//, "")),
        h("td", fmtNumber(d.health_p95_ms, 2)),
        h("td.wrap", d.detail || "")))))),
    devices.length > view.shown
      ? h("p", h("button", { type: "button", "data-more": "1" }, `Show more (${devices.length - view.shown} left)`)) : null,
  ];
}

/** A baked wave whose gate has no data waits for it, until a deadline; then it halts. */
function waiting(r) {
  const w = r.waiting_for_data;
  if (!w) return null;
  return h("section.panel.waiting#waiting-for-data", { role: "status" },
    h("strong", `Wave ${w.wave} is waiting for data`),
    ` from ${(w.gates || []).join(", ")}: it is promoted when the data arrives and halts at `,
    h("time", { datetime: new Date(w.deadline * 1000).toISOString() }, fmtTime(w.deadline)), " without it.");
}

function waveState(w, r) {
  if (["scheduled", "awaiting-approval"].includes(r.status)) return "planned"; // not started: nothing sent yet
  if (w.state === "pending") return ["running", "paused"].includes(r.status) ? "planned" : "cancelled"; // never started
  if (w.state === "done") return r.status === "done" || w.wave < r.wave ? "promoted" : r.status;
  return PHASES[r.phase] || r.phase;
}

function waveTable(r) {
  const rows = r.progress || [];
  if (!rows.length) return h("p.muted", "No device planned.");
  return h("div.scroll", h("table#waves",
    h("thead", h("tr", ["Wave", "State", "Devices", "Progress", "OK", "Failed", "Rolled back", "Installing", "Planned"].map((c) => h("th", c)))),
    h("tbody", rows.map((w) => h(`tr${w.wave === r.wave ? ".current" : ""}`, { "data-key": String(w.wave), dataset: { wave: w.wave } },
      h("td", w.wave === r.wave ? h("strong", `${w.wave} ◂`) : String(w.wave)),
      h("td.wave-state", pill(waveState(w, r))),
      h("td", w.devices),
      h("td", progress(w.ok, w.devices, w.failed + w.rolled_back)),
      h("td", w.ok),
      h("td.failed", w.failed),
      h("td.rolled-back", w.rolled_back ? `${w.rolled_back} (by the ${w.rolled_back_by})` : "0"),
      h("td.installing", w.installing + (w.deferred ? ` (+${w.deferred} offline)` : "")),
      h("td.planned", w.planned))))));
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
  const gates = r.gate_values || [];
  if (!gates.length) return h("p.muted", "No gate.");
  return h("div.scroll", h("table#gates",
    h("thead", h("tr", h("th", "Gate"), h("th", "Value now"), h("th", "Threshold"), h("th", "Verdict"), h("th", "Detail"))),
    h("tbody", gates.map((g) => {
      const verdict = VERDICTS[g.verdict] || g.verdict;
      return h(`tr${verdict === "fail" ? ".gate-fail" : ""}`, { "data-key": g.gate, dataset: { gate: g.gate, verdict } },
        h("td", h("code", g.gate)),
        h("td", gateValue(g)),
        h("td", threshold(g)),
        h("td", pill(verdict)),
        h("td.wrap", g.detail || ""));
    }))));
}
