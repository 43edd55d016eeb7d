// Charts drawn as SVG: a time series chart and a breakdown of counts. No library needed.
//
// A line is broken where data is missing (a value that is not a number, or a pause between points much
// longer than the series' usual step: the device was offline), never drawn straight across the gap.
// Hovering a chart shows the time and every series' value nearest the pointer.

const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fde", "#e07b1a", "#2a9d5b", "#b03a7a"];

function svg(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

const GAP_STEPS = 3; // a pause longer than this many usual steps between two points is a gap

/** The points cut into runs with no gap inside: [[ts, value], ...] per run. */
export function segments(points) {
  const steps = [];
  for (let i = 1; i < points.length; i += 1) steps.push(points[i][0] - points[i - 1][0]);
  const sorted = steps.filter((d) => d > 0).sort((a, b) => a - b);
  const usual = sorted.length ? sorted[Math.floor(sorted.length / 2)] : Infinity;
  const runs = [];
  let run = [];
  points.forEach((p, i) => {
    const broken = !Number.isFinite(p[1]) || (i > 0 && p[0] - points[i - 1][0] > GAP_STEPS * usual);
    if (broken && run.length) { runs.push(run); run = []; }
    if (Number.isFinite(p[1])) run.push(p);
  });
  if (run.length) runs.push(run);
  return runs;
}

let hovered = null; // {title, fx}: where the pointer was over which chart, so a chart redrawn by a live update keeps its tip

function clock(ts) {
  const d = new Date(ts * 1000);
  return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}:${String(d.getSeconds()).padStart(2, "0")}`;
}

/**
 * A line chart. ``series``: [{name, points: [[ts, value], ...]}]; ``unit`` is shown on the y axis.
 * Returns a <figure> with the chart's title; an empty series list says "no data yet".
 */
export function lineChart(title, series, unit = "", opts = {}) {
  const width = opts.width || 460;
  const height = opts.height || 160;
  const pad = { l: 44, r: 10, t: 10, b: 22 };
  const figure = document.createElement("figure");
  figure.className = "chart";
  figure.dataset.chart = title;
  const caption = document.createElement("figcaption");
  caption.textContent = unit ? `${title} (${unit})` : title;
  figure.append(caption);
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  if (!all.length) {
    const empty = document.createElement("p");
    empty.className = "muted";
    empty.textContent = "no data yet";
    figure.append(empty);
    return figure;
  }
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
  const yMax = niceMax(opts.yMax || Math.max(...all.map((p) => p[1])));
  const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - (v / yMax) * (height - pad.t - pad.b);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  for (let i = 0; i <= 4; i += 1) {
    const v = (yMax * i) / 4;
    root.append(svg("line", { x1: pad.l, x2: width - pad.r, y1: y(v), y2: y(v), class: "grid" }));
    root.append(svg("text", { x: pad.l - 4, y: y(v) + 4, "text-anchor": "end", class: "tick" }, formatTick(v)));
  }
  root.append(svg("text", { x: pad.l, y: height - 4, class: "tick" }, clock(t0)));
  root.append(svg("text", { x: width - pad.r, y: height - 4, "text-anchor": "end", class: "tick" }, clock(t1)));
  series.forEach((s, i) => {
    const runs = segments(s.points);
    if (!runs.length) return;
    const d = runs.map((run) => run.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("")).join("");
    root.append(svg("path", { d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.8 }));
    for (const run of runs.filter((r) => r.length === 1)) {  // a lone point between gaps is a dot
      root.append(svg("circle", { cx: x(run[0][0]), cy: y(run[0][1]), r: 3, fill: COLORS[i % COLORS.length] }));
    }
  });
  figure.append(root);
  hover(figure, root, title, series, unit, { x, y, t0, t1, pad, width, height });
  if (series.length > 1) {
    const legend = document.createElement("div");
    legend.className = "legend";
    series.forEach((s, i) => {
      const item = document.createElement("span");
      item.style.setProperty("--c", COLORS[i % COLORS.length]);
      item.textContent = s.name;
      legend.append(item);
    });
    figure.append(legend);
  }
  return figure;
}

/** The tip: a guide line, a dot on each series' nearest point, and their values as text. */
function hover(figure, root, title, series, unit, geo) {
  const guide = svg("line", { y1: geo.pad.t, y2: geo.height - geo.pad.b, class: "guide", visibility: "hidden" });
  const dots = series.map((_, i) => svg("circle", { r: 3.5, fill: COLORS[i % COLORS.length], visibility: "hidden" }));
  const area = svg("rect", { x: geo.pad.l, y: geo.pad.t, width: geo.width - geo.pad.l - geo.pad.r,
    height: geo.height - geo.pad.t - geo.pad.b, fill: "transparent", class: "hover-area" });
  root.append(guide, ...dots, area);
  const tip = document.createElement("div");
  tip.className = "tip";
  tip.hidden = true;
  figure.append(tip);
  const show = (fx) => {
    const t = geo.t0 + fx * (geo.t1 - geo.t0);
    const parts = [];
    series.forEach((s, i) => {
      const pts = s.points.filter((p) => Number.isFinite(p[1]));
      if (!pts.length) { dots[i].setAttribute("visibility", "hidden"); return; }
      const near = pts.reduce((a, b) => (Math.abs(b[0] - t) < Math.abs(a[0] - t) ? b : a));
      dots[i].setAttribute("cx", geo.x(near[0]));
      dots[i].setAttribute("cy", geo.y(near[1]));
      dots[i].setAttribute("visibility", "visible");
      parts.push(`${s.name} ${formatValue(near[1])}${unit ? ` ${unit}` : ""}`);
    });
    const gx = geo.x(t);
    guide.setAttribute("x1", gx);
    guide.setAttribute("x2", gx);
    guide.setAttribute("visibility", "visible");
    tip.textContent = `${clock(t)} · ${parts.join(" · ")}`;
    tip.hidden = false;
  };
  area.addEventListener("mousemove", (e) => {
    const box = area.getBoundingClientRect();
    const fx = Math.min(1, Math.max(0, (e.clientX - box.left) / box.width));
    hovered = { title, fx };
    show(fx);
  });
  area.addEventListener("mouseleave", () => {
    hovered = null;
    tip.hidden = true;
    guide.setAttribute("visibility", "hidden");
    for (const dot of dots) dot.setAttribute("visibility", "hidden");
  });
  if (hovered && hovered.title === title) show(hovered.fx);
}

function formatValue(v) {
  return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2);
}

function formatTick(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(v < 1 ? 2 : 1);
}

/**
 * Counts as horizontal bars: ``counts`` is {label: n}; ``link(label)`` gives an href for each bar.
 */
export function breakdown(title, counts, link) {
  const figure = document.createElement("figure");
  figure.className = "breakdown";
  figure.dataset.breakdown = title;
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  figure.append(caption);
  const entries = Object.entries(counts || {}).sort((a, b) => b[1] - a[1]);
  const max = Math.max(1, ...entries.map((e) => e[1]));
  const list = document.createElement("ul");
  for (const [label, n] of entries) {
    const li = document.createElement("li");
    const name = document.createElement(link ? "a" : "span");
    name.className = "label";
    name.textContent = label;
    if (link) name.href = link(label);
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = `${(100 * n) / max}%`;
    const count = document.createElement("span");
    count.className = "count";
    count.textContent = n.toLocaleString();
    li.append(name, bar, count);
    list.append(li);
  }
  if (!entries.length) {
    const li = document.createElement("li");
    li.className = "muted";
    li.textContent = "none";
    list.append(li);
  }
  figure.append(list);
  return figure;
}
