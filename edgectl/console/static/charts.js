// Charts drawn as SVG: a time series chart and a breakdown of counts. No library needed.

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
    const pts = s.points.filter((p) => Number.isFinite(p[1]));
    if (!pts.length) return;
    const d = pts.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
    root.append(svg("path", { d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.8 }));
    if (pts.length === 1) root.append(svg("circle", { cx: x(pts[0][0]), cy: y(pts[0][1]), r: 3, fill: COLORS[i % COLORS.length] }));
  });
  figure.append(root);
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
