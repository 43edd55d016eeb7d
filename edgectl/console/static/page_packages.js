// Packages the server verified and keeps; operators upload a signed .edgepkg (the server never signs anything).

import { fill, fmtBytes, fmtTime, h } from "./dom.js";

export const NAV = "packages";
export const PAGE = "packages";
export const TITLE = "Packages";

export async function mount(main, _args, _params, ctx) {
  const table = h("div#packages-table");
  const upload = ctx.can("operator") ? uploadForm(ctx, () => refresh()) : h("p.muted", "Viewers can list packages; operators upload them.");
  fill(main, h("h1", "Packages"), upload, table);
  const refresh = async () => {
    const list = await ctx.api("/packages");
    draw(table, list.packages || [], ctx, refresh);
  };
  await refresh();
  return { refresh };
}

function uploadForm(ctx, done) {
  const file = h("input#package-file", { type: "file", accept: ".edgepkg", required: true });
  const form = h("form.filters#upload", {
    onsubmit: async (event) => {
      event.preventDefault();
      if (!file.files.length) return;
      const chosen = file.files[0];
      try {
        const pkg = await ctx.api("/packages", { method: "POST", raw: await chosen.arrayBuffer() });
        ctx.flash(`Uploaded ${pkg.label || chosen.name}: signature and hashes verified.`, "info");
        form.reset();
        await done();
      } catch (err) {
        ctx.flash(`${chosen.name}: ${err.message}`);
      }
    },
  }, h("label", "Signed package (.edgepkg)", file), h("button.primary", { type: "submit" }, "Upload"));
  return form;
}

function draw(el, items, ctx, done) {
  if (!items.length) {
    fill(el, h("p.muted", "No package uploaded yet."));
    return;
  }
  fill(el, h("table",
    h("thead", h("tr", ["Package", "Name", "Version", "Target", "Size", "Uploaded", "By", ""].map((c) => h("th", c)))),
    h("tbody", items.map((p) => h("tr", { dataset: { package: p.variant } },
      h("td", p.label),
      h("td", p.name),
      h("td", p.version),
      h("td", p.target),
      h("td", fmtBytes(p.size)),
      h("td", fmtTime(p.uploaded)),
      h("td", p.actor || "–"),
      h("td", ctx.can("operator")
        ? [h("a", { href: `#/rollouts/new?package=${encodeURIComponent(p.variant)}` }, "Roll out…"), " ",
          h("button.delete-package", { type: "button", onclick: () => remove(p, ctx, done) }, "Delete…")] : ""))))));
}

/** Delete a package no rollout names (the server refuses one a rollout names, and says which). */
async function remove(p, ctx, done) {
  const ok = await ctx.confirm(`Delete ${p.label}?`, "The package and its kept file are removed. A package "
    + "any rollout names, finished ones included, is refused.", "Delete");
  if (!ok) return;
  try {
    await ctx.api(`/packages/${encodeURIComponent(p.variant)}`, { method: "DELETE" });
    ctx.flash(`Deleted ${p.label}.`, "info");
    await done();
  } catch (err) { ctx.flash(err.message); }
}
