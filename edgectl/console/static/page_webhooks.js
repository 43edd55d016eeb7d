// Webhooks: the list (admins add and delete), and one webhook's delivery log (admins redeliver). Operators read.

import { fill, fmtTime, h, pill } from "./dom.js";

export const NAV = "webhooks";
export const PAGE = "webhooks";
export const TITLE = "Webhooks";

const STATUSES = ["", "pending", "delivered", "failed"];

export async function mount(main, args, params, ctx) {
  if (!ctx.can("operator")) {
    fill(main, h("h1", "Webhooks"), h("p.muted", "Operators and admins see webhooks (their URLs may carry a receiver's token)."));
    return {};
  }
  return args.length ? deliveries(main, args[0], params, ctx) : list(main, ctx);
}

async function list(main, ctx) {
  const table = h("div#webhooks-table");
  const secret = h("div#webhook-secret");
  const refresh = async () => draw(table, (await ctx.api("/webhooks")).webhooks || [], ctx, refresh);
  fill(main, h("h1", "Webhooks"),
    ctx.can("admin") ? addForm(ctx, secret, refresh) : h("p.muted", "Admins add and delete webhooks."), secret, table);
  await refresh();
  return { refresh };
}

function addForm(ctx, secretBox, done) {
  const url = h("input#webhook-url", { type: "url", required: true, placeholder: "https://hooks.example.com/edge", size: 40 });
  const events = h("input#webhook-events", { value: "*", required: true, size: 30, title: "Comma-separated: rollout.*, device.deployment_failed, *" });
  const form = h("form.filters#add-webhook", {
    onsubmit: async (event) => {
      event.preventDefault();
      const body = { url: url.value.trim(), events: events.value.split(",").map((e) => e.trim()).filter(Boolean) };
      try {
        const hook = await ctx.api("/webhooks", { method: "POST", body });
        ctx.flash(`Webhook ${hook.id} added.`, "info");
        // Shown once: the server keeps it to sign deliveries and never answers it again.
        fill(secretBox, h("p", "Signing secret (copy it now, it is not shown again): ", h("code#new-secret", hook.secret)));
        form.reset();
        await done();
      } catch (err) {
        ctx.flash(err.message);
      }
    },
  }, h("label", "URL", url), h("label", "Events", events), h("button.primary", { type: "submit" }, "Add webhook"));
  return form;
}

function draw(el, hooks, ctx, refresh) {
  if (!hooks.length) {
    fill(el, h("p.muted", "No webhook yet."));
    return;
  }
  fill(el, h("table",
    h("thead", h("tr", ["Webhook", "URL", "Events", "Secret", "Created", "By", ""].map((c) => h("th", c)))),
    h("tbody", hooks.map((w) => h("tr", { dataset: { webhook: w.id } },
      h("td", h("a", { href: `#/webhooks/${encodeURIComponent(w.id)}` }, w.id)),
      h("td.wrap", w.url),
      h("td", w.events.join(", ")),
      h("td", h("code", w.secret_hint)),
      h("td", fmtTime(w.created_at)),
      h("td", w.created_by || "–"),
      h("td", ctx.can("admin") ? h("button.danger", { type: "button", dataset: { remove: w.id },
        onclick: () => remove(w, ctx, refresh) }, "Delete") : ""))))));
}

async function remove(hook, ctx, refresh) {
  if (!(await ctx.confirm(`Delete webhook ${hook.id}?`, `Nothing more is sent to ${hook.url}; its delivery log goes too.`,
    "Delete"))) return;
  try {
    await ctx.api(`/webhooks/${encodeURIComponent(hook.id)}`, { method: "DELETE" });
    ctx.flash(`Webhook ${hook.id} deleted.`, "info");
    await refresh();
  } catch (err) {
    ctx.flash(err.message);
  }
}

async function deliveries(main, id, params, ctx) {
  const hook = await ctx.api(`/webhooks/${encodeURIComponent(id)}`);
  const status = h("select#delivery-status", {
    onchange: () => ctx.go(`#/webhooks/${encodeURIComponent(id)}${status.value ? `?status=${status.value}` : ""}`),
  }, STATUSES.map((s) => h("option", { value: s }, s || "any status")));
  status.value = params.get("status") || "";
  const table = h("div#deliveries-table");
  fill(main, h("h1", `Webhook ${hook.id}`), h("p", h("code", hook.url), " · ", hook.events.join(", ")),
    h("p", h("a", { href: "#/webhooks" }, "← all webhooks")), h("form.filters", h("label", "Status", status)), table);
  const refresh = async () => {
    const query = `?limit=200${status.value ? `&status=${status.value}` : ""}`;
    const found = await ctx.api(`/webhooks/${encodeURIComponent(id)}/deliveries${query}`);
    drawDeliveries(table, hook, found.deliveries || [], ctx, refresh);
  };
  await refresh();
  return { refresh };
}

function drawDeliveries(el, hook, items, ctx, refresh) {
  if (!items.length) {
    fill(el, h("p.muted", "No delivery yet."));
    return;
  }
  fill(el, h("table",
    h("thead", h("tr", ["Delivery", "Event", "Status", "Attempts", "Answer", "Next attempt", "Created", ""].map((c) => h("th", c)))),
    h("tbody", items.map((d) => h("tr", { dataset: { delivery: d.id, status: d.status } },
      h("td", h("code", d.id)),
      h("td", d.event),
      h("td", pill(d.status)),
      h("td", d.attempts),
      h("td.wrap", d.error || (d.status_code === null ? "–" : `HTTP ${d.status_code}`)),
      h("td", d.status === "pending" ? fmtTime(d.next_attempt) : "–"),
      h("td", fmtTime(d.created_at)),
      h("td", ctx.can("admin") ? h("button", { type: "button", dataset: { redeliver: d.id },
        onclick: () => redeliver(hook, d, ctx, refresh) }, "Redeliver") : ""))))));
}

async function redeliver(hook, delivery, ctx, refresh) {
  try {
    const again = await ctx.api(`/webhooks/${encodeURIComponent(hook.id)}/deliveries/${encodeURIComponent(delivery.id)}/redeliver`,
      { method: "POST" });
    ctx.flash(`Delivery ${again.id} queued: ${again.event} again.`, "info");
    await refresh();
  } catch (err) {
    ctx.flash(err.message);
  }
}
