// Building DOM nodes without innerHTML: every text the server sends is set as text, never parsed as HTML.

/** h("div.card#x", {onclick, dataset: {test: "a"}}, child, "text", [more]) -> HTMLElement */
export function h(spec, attrs, ...children) {
  const [tagAndClasses, id] = spec.split("#");
  const [tag, ...classes] = tagAndClasses.split(".");
  const el = document.createElement(tag || "div");
  if (classes.length) el.className = classes.join(" ");
  if (id) el.id = id;
  // A first child that is not an attribute object (text, a number, 0 included, a node, a list) is a child.
  if (attrs !== undefined && attrs !== null && (typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "value") el.value = value;
    else if (key === "checked") el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace everything inside ``el`` with ``children``. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function fmtTime(ts) {
  if (!ts) return "–";
  const d = new Date(ts * 1000);
  return d.toLocaleString(undefined, { hour12: false });
}

export function fmtAgo(ts) {
  if (!ts) return "never";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function fmtNumber(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits });
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** A status word as a coloured pill (class names follow the word: online, failed, done ...). */
export function pill(word) {
  const text = word === null || word === undefined || word === "" ? "–" : String(word);
  return h(`span.pill.s-${text.replace(/[^a-z0-9-]/gi, "")}`, text);
}

/** A small bar: ``done`` of ``total``, with an optional ``failed`` share in red. */
export function progress(done, total, failed = 0) {
  const pct = total ? (100 * done) / total : 0;
  const bad = total ? (100 * failed) / total : 0;
  return h("div.progress", { title: `${done}/${total}`, role: "progressbar", "aria-valuenow": Math.round(pct) },
    h("div.progress-ok", { style: `width:${pct}%` }),
    h("div.progress-bad", { style: `width:${bad}%` }));
}

/**
 * Make ``el``'s children look like ``children`` while keeping the nodes that stay: a live update of a page
 * the operator is using keeps its buttons (a click in flight lands on the element it aimed at) and the
 * keyboard focus. Elements are matched in order by tag and ``data-key``; attributes and text are updated in
 * place. Listeners are not carried over: controls updated this way handle events by delegation or read
 * their ``data-*`` attributes when clicked.
 */
export function update(el, ...children) {
  const fresh = document.createElement(el.tagName);
  append(fresh, children);
  morphChildren(el, fresh);
  return el;
}

function same(a, b) {
  return a.nodeType === b.nodeType && a.nodeName === b.nodeName
    && (a.nodeType !== Node.ELEMENT_NODE || a.getAttribute("data-key") === b.getAttribute("data-key"));
}

function morphChildren(target, source) {
  const wanted = [...source.childNodes];
  let node = target.firstChild;
  for (const next of wanted) {
    if (node && same(node, next)) {
      morphNode(node, next);
      node = node.nextSibling;
    } else {
      target.insertBefore(next, node); // moved out of ``source``: a new node with its own listeners
    }
  }
  while (node) {
    const extra = node;
    node = node.nextSibling;
    extra.remove();
  }
}

function morphNode(target, source) {
  if (target.nodeType !== Node.ELEMENT_NODE) {
    if (target.nodeValue !== source.nodeValue) target.nodeValue = source.nodeValue;
    return;
  }
  for (const { name } of [...target.attributes]) if (!source.hasAttribute(name)) target.removeAttribute(name);
  for (const { name, value } of [...source.attributes]) if (target.getAttribute(name) !== value) target.setAttribute(name, value);
  if ("disabled" in target && target.disabled !== source.disabled) target.disabled = source.disabled;
  morphChildren(target, source);
}
