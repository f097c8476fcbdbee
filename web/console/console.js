/* console.js - the merchant's console over autoreply's own API: the inbox of pending review
 * replies (approve, edit, reject, regenerate, with keys for the fast path), bulk jobs, live
 * figures from GET /v1/stats as small SVG charts, and shop profiles. No framework and no build
 * step: the server sends these files as they are written. Every API error is shown in the view
 * that asked, never thrown. */
"use strict";

(function () {
  const KEY_STORE = "autoreply.key";   /* sessionStorage: gone when the browser session ends */
  const LANG_STORE = "autoreply.lang"; /* localStorage: a switched language stays switched */
  const LIVE_PERIOD_MS = 3000;
  const JOBS_PERIOD_MS = 3000;
  const LIVE_POINTS = 60;

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  };

  /* ---- language ---------------------------------------------------------------------- */

  let lang = localStorage.getItem(LANG_STORE) ||
    ((navigator.language || "en").toLowerCase().startsWith("zh") ? "zh" : "en");

  function t(key, vars) {
    const table = window.I18N[lang] || window.I18N.en;
    let s = table[key] !== undefined ? table[key] : window.I18N.en[key];
    if (s === undefined) s = key;
    for (const [k, v] of Object.entries(vars || {})) s = s.split("{" + k + "}").join(String(v));
    return s;
  }

  function applyLang() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    for (const e of document.querySelectorAll("[data-t]")) e.textContent = t(e.dataset.t);
  }

  /* ---- the API ------------------------------------------------------------------------ */

  /* {ok, status, data, error}: error is the server's message (or the network's) when !ok. */
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = "Bearer " + key;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch(path, {
        method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      return { ok: false, status: 0, error: String(e && e.message ? e.message : e) };
    }
    let data = null;
    const text = await resp.text();
    if (text) {
      try { data = JSON.parse(text); } catch (e) { data = text; }
    }
    if (resp.status === 401) askKey();
    if (!resp.ok) {
      const msg = data && data.error && data.error.message ? data.error.message
        : resp.status + " " + resp.statusText;
      return { ok: false, status: resp.status, data, error: msg };
    }
    return { ok: true, status: resp.status, data };
  }

  function qs(params) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) p.set(k, v);
    const s = p.toString();
    return s ? "?" + s : "";
  }

  let keyAsked = false;
  function askKey() {
    if (keyAsked) return;
    keyAsked = true;
    const d = $("key-dialog");
    $("key-input").value = "";
    if (typeof d.showModal === "function" && !d.open) d.showModal();
  }

  function notice(msg) {
    const n = $("notice");
    n.textContent = msg;
    n.hidden = false;
    clearTimeout(notice.timer);
    notice.timer = setTimeout(() => { n.hidden = true; }, 3000);
  }

  const fmtTime = (secs) => secs ? new Date(secs * 1000).toLocaleString(lang === "zh" ? "zh-CN" : "en") : "";
  const stars = (n) => "★".repeat(Math.max(0, Math.min(5, n | 0))) + "☆".repeat(5 - Math.max(0, Math.min(5, n | 0)));

  /* ---- inbox -------------------------------------------------------------------------- */

  const inbox = { items: [], sel: 0, cursor: null, busy: false };

  function inboxFilters() {
    return {
      status: "pending", limit: 50,
      shop_id: $("f-shop").value.trim(),
      rating: $("f-rating").value,
      sentiment: $("f-sentiment").value,
    };
  }

  async function loadInbox(more) {
    const params = inboxFilters();
    if (more && inbox.cursor) params.cursor = inbox.cursor;
    $("inbox-status").textContent = t("loading");
    const r = await api("GET", "/v1/reviews" + qs(params));
    if (!r.ok) {
      if (!more) { inbox.items = []; renderInbox(); }
      $("inbox-status").textContent = t("api_missing", { msg: r.error });
      $("inbox-more").hidden = true;
      return;
    }
    const data = Array.isArray(r.data && r.data.data) ? r.data.data : [];
    inbox.items = more ? inbox.items.concat(data) : data;
    inbox.cursor = r.data.next_cursor || null;
    if (!more) inbox.sel = 0;
    $("inbox-more").hidden = !inbox.cursor;
    renderInbox();
  }

  function reviewPath(it, action) {
    return "/v1/reviews/" + encodeURIComponent(it.shop_id) + "/" +
      encodeURIComponent(it.review_id) + (action ? "/" + action : "");
  }

  function renderInbox() {
    const list = $("inbox-list");
    list.textContent = "";
    $("inbox-status").textContent = inbox.items.length
      ? t("inbox_count", { n: inbox.items.length }) : t("inbox_empty");
    inbox.items.forEach((it, i) => {
      const draft = el("textarea", { class: "draft", rows: "3", "aria-label": t("approve") });
      draft.value = it.reply || "";
      const card = el("li", { class: "card" + (i === inbox.sel ? " selected" : ""), "data-i": String(i) },
        el("div", { class: "meta" },
          el("span", { class: "stars", title: String(it.rating), text: stars(it.rating) }),
          el("span", { class: "badge " + (it.sentiment || ""), text: t(it.sentiment || "neutral") }),
          it.needs_human ? el("span", { class: "badge human", text: t("needs_human") }) : null,
          el("span", { class: "ids", text: it.shop_id + " / " + it.review_id }),
          el("span", { class: "when", text: fmtTime(it.created) })),
        el("p", { class: "review", text: it.text || "" }),
        draft,
        el("div", { class: "actions" },
          el("button", { type: "button", class: "approve", text: t("approve") + " (a)", onclick: () => act(i, "approve") }),
          el("button", { type: "button", class: "reject", text: t("reject") + " (r)", onclick: () => act(i, "reject") }),
          el("button", { type: "button", class: "regenerate", text: t("regenerate") + " (g)", onclick: () => act(i, "regenerate") })));
      card.addEventListener("click", () => select(i, false));
      list.append(card);
    });
  }

  function select(i, scroll) {
    if (!inbox.items.length) return;
    inbox.sel = Math.max(0, Math.min(inbox.items.length - 1, i));
    const cards = $("inbox-list").children;
    for (let j = 0; j < cards.length; j++) cards[j].classList.toggle("selected", j === inbox.sel);
    if (scroll && cards[inbox.sel]) cards[inbox.sel].scrollIntoView({ block: "nearest" });
  }

  async function act(i, action) {
    const it = inbox.items[i];
    if (!it || inbox.busy) return;
    const card = $("inbox-list").children[i];
    const draft = card && card.querySelector("textarea");
    const body = action === "approve" && draft ? { reply: draft.value } : undefined;
    inbox.busy = true;
    if (card) card.classList.add("busy");
    const r = await api("POST", reviewPath(it, action), body);
    inbox.busy = false;
    if (card) card.classList.remove("busy");
    if (!r.ok) {
      notice(t("error", { msg: r.error }));
      return;
    }
    const id = it.review_id;
    if (action === "regenerate" && r.data && r.data.status === "pending") {
      inbox.items[i] = r.data;
    } else {
      inbox.items.splice(i, 1);
    }
    notice(t(action === "approve" ? "approved" : action === "reject" ? "rejected" : "regenerated", { id }));
    renderInbox();
    select(Math.min(i, inbox.items.length - 1), true);
  }

  function onKey(ev) {
    if (currentView() !== "inbox" || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const tag = ev.target && ev.target.tagName;
    if (tag === "TEXTAREA" || tag === "INPUT" || tag === "SELECT") {
      if (ev.key === "Escape") ev.target.blur();
      return;
    }
    if ($("key-dialog").open) return;
    const k = ev.key;
    if (k === "j") select(inbox.sel + 1, true);
    else if (k === "k") select(inbox.sel - 1, true);
    else if (k === "a") act(inbox.sel, "approve");
    else if (k === "r") act(inbox.sel, "reject");
    else if (k === "g") act(inbox.sel, "regenerate");
    else if (k === "e") {
      const card = $("inbox-list").children[inbox.sel];
      const d = card && card.querySelector("textarea");
      if (d) d.focus();
    } else return;
    ev.preventDefault();
  }

  /* ---- jobs --------------------------------------------------------------------------- */

  async function loadJobs() {
    const r = await api("GET", "/v1/jobs?limit=50");
    const body = $("jobs-table").tBodies[0];
    if (!r.ok) {
      $("jobs-status").textContent = t("jobs_error", { msg: r.error });
      body.textContent = "";
      return;
    }
    const jobs = Array.isArray(r.data && r.data.data) ? r.data.data : [];
    $("jobs-status").textContent = jobs.length ? "" : t("jobs_empty");
    body.textContent = "";
    for (const j of jobs) {
      const total = j.total || 0;
      const done = (j.done || 0) + (j.failed || 0);
      const pct = total ? Math.round((100 * done) / total) : 0;
      const bar = el("div", { class: "bar", role: "progressbar", "aria-valuenow": String(pct),
        "aria-valuemin": "0", "aria-valuemax": "100" }, el("div", { class: "fill" }));
      bar.firstChild.style.width = pct + "%";
      const open = j.status === "queued" || j.status === "running";
      body.append(el("tr", {},
        el("td", { class: "mono", text: j.id }),
        el("td", { text: j.status }),
        el("td", {}, bar, el("span", { class: "count", text: done + " / " + total })),
        el("td", { text: fmtTime(j.created) }),
        el("td", { class: "actions" },
          open ? el("button", { type: "button", text: t("cancel"), onclick: () => cancelJob(j.id) }) : null,
          el("button", { type: "button", text: t("jsonl"), onclick: () => download(j.id, "jsonl") }),
          el("button", { type: "button", text: t("csv"), onclick: () => download(j.id, "csv") }))));
    }
  }

  async function cancelJob(id) {
    const r = await api("DELETE", "/v1/jobs/" + encodeURIComponent(id));
    notice(r.ok ? t("cancelled", { id }) : t("error", { msg: r.error }));
    loadJobs();
  }

  /* Every line of a job's results, page by page (format=json). */
  async function allResults(id) {
    let cursor = null;
    const rows = [];
    for (;;) {
      const r = await api("GET", "/v1/jobs/" + encodeURIComponent(id) + "/results" +
        qs({ format: "json", limit: 1000, cursor }));
      if (!r.ok) throw new Error(r.error);
      rows.push(...(r.data.data || []));
      if (!r.data.has_more || !r.data.next_cursor) return rows;
      cursor = r.data.next_cursor;
    }
  }

  function csvCell(v) {
    if (v == null) return "";
    const s = typeof v === "object" ? JSON.stringify(v) : String(v);
    return /[",\r\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }

  function toCsv(rows) {
    const cols = [];
    for (const r of rows) for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
    const lines = [cols.map(csvCell).join(",")];
    for (const r of rows) lines.push(cols.map((c) => csvCell(r[c])).join(","));
    /* a byte order mark so that spreadsheet programs read the Chinese text as UTF-8 */
    return "\ufeff" + lines.join("\r\n") + "\r\n";
  }

  async function download(id, kind) {
    let rows;
    try { rows = await allResults(id); } catch (e) { notice(t("error", { msg: e.message })); return; }
    const text = kind === "csv" ? toCsv(rows) : rows.map((r) => JSON.stringify(r)).join("\n") + "\n";
    const blob = new Blob([text], { type: kind === "csv" ? "text/csv" : "application/x-ndjson" });
    const a = el("a", { href: URL.createObjectURL(blob), download: id + "." + kind });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  /* ---- live --------------------------------------------------------------------------- */

  const SVG = "http://www.w3.org/2000/svg";
  const series = {
    rps: [], p50: [], p99: [], hit: [], queue: [], tps: [],
  };
  const charts = [
    { id: "rps", label: "rps", lines: ["rps"] },
    { id: "lat", label: "latency", lines: ["p50", "p99"] },
    { id: "hit", label: "hit_ratio", lines: ["hit"], max: 1 },
    { id: "queue", label: "queue", lines: ["queue"] },
    { id: "tps", label: "tps", lines: ["tps"] },
  ];

  function buildCharts() {
    const box = $("charts");
    box.textContent = "";
    for (const c of charts) {
      const svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("viewBox", "0 0 240 80");
      svg.setAttribute("class", "spark");
      svg.setAttribute("id", "chart-" + c.id);
      const axis = document.createElementNS(SVG, "line");
      axis.setAttribute("class", "axis");
      axis.setAttribute("x1", "0");
      axis.setAttribute("x2", "240");
      axis.setAttribute("y1", "78.5");
      axis.setAttribute("y2", "78.5");
      c.lines.forEach((_, i) => {
        const p = document.createElementNS(SVG, "polyline");
        p.setAttribute("class", "line l" + i);
        svg.append(p);
      });
      svg.append(axis);
      box.append(el("figure", { class: "chart" },
        el("figcaption", {}, el("span", { text: t(c.label) }), el("b", { id: "val-" + c.id, text: "–" })),
        svg));
    }
  }

  function fmtNum(v, digits) {
    if (v == null || !isFinite(v)) return "–";
    return Number(v).toFixed(digits);
  }

  function drawCharts() {
    for (const c of charts) {
      const svg = $("chart-" + c.id);
      if (!svg) continue;
      let max = c.max || 0;
      for (const name of c.lines) for (const v of series[name]) if (v != null && v > max) max = v;
      if (!(max > 0)) max = 1;
      c.lines.forEach((name, i) => {
        const pts = [];
        /* the newest point at the right edge, older ones scrolling left */
        const shift = LIVE_POINTS - series[name].length;
        series[name].forEach((v, k) => {
          if (v == null) return;
          const x = (240 * (k + shift)) / (LIVE_POINTS - 1);
          const y = 78 - (74 * v) / max;
          pts.push(x.toFixed(1) + "," + y.toFixed(1));
        });
        svg.querySelector(".l" + i).setAttribute("points", pts.join(" "));
      });
    }
  }

  async function pollLive() {
    const r = await api("GET", "/v1/stats?window=10");
    if (!r.ok) {
      $("live-status").textContent = t("live_error", { msg: r.error });
      return;
    }
    const s = r.data;
    const push = (name, v) => {
      series[name].push(v == null || !isFinite(v) ? null : v);
      while (series[name].length > LIVE_POINTS) series[name].shift();
    };
    push("rps", s.requests_per_s);
    push("p50", s.latency_p50_ms);
    push("p99", s.latency_p99_ms);
    push("hit", s.cache_hit_ratio);
    push("queue", s.queue_depth);
    push("tps", s.tokens_per_s);
    $("val-rps").textContent = fmtNum(s.requests_per_s, 2);
    $("val-lat").textContent = fmtNum(s.latency_p50_ms, 1) + " / " + fmtNum(s.latency_p99_ms, 1);
    $("val-hit").textContent = s.cache_hit_ratio == null ? "–" : fmtNum(100 * s.cache_hit_ratio, 1) + "%";
    $("val-queue").textContent = fmtNum(s.queue_depth, 0);
    $("val-tps").textContent = fmtNum(s.tokens_per_s, 1);
    const sv = s.cache_savings || {};
    const dl = $("savings");
    dl.textContent = "";
    for (const [label, v, d] of [["saved_replies", sv.replies, 0], ["saved_seconds", sv.model_seconds, 1],
      ["saved_tokens", sv.tokens, 0]]) {
      dl.append(el("dt", { text: t(label) }), el("dd", { text: fmtNum(v, d) }));
    }
    $("live-status").textContent = t("updated", { time: new Date().toLocaleTimeString() });
    drawCharts();
  }

  /* ---- shops -------------------------------------------------------------------------- */

  let shops = [];
  let editing = null;

  async function loadShops() {
    const r = await api("GET", "/v1/shops");
    if (!r.ok) {
      $("shops-status").textContent = t("shops_error", { msg: r.error });
      return;
    }
    shops = Array.isArray(r.data && r.data.data) ? r.data.data : [];
    $("shops-status").textContent = shops.length ? "" : t("shops_empty");
    const ul = $("shops-list");
    ul.textContent = "";
    const dl = $("shop-list");
    dl.textContent = "";
    for (const p of shops) {
      ul.append(el("li", {}, el("button", { type: "button", text: p.shop_id + (p.name ? " · " + p.name : ""),
        onclick: () => editShop(p) })));
      dl.append(el("option", { value: p.shop_id }));
    }
  }

  const lines = (s) => s.split(/\n/).map((x) => x.trim()).filter(Boolean);

  function editShop(p) {
    editing = p;
    $("shop-form").hidden = false;
    $("shop-title").textContent = p.shop_id;
    $("s-persona").value = p.persona || "";
    $("s-lang").value = p.lang || "same";
    $("s-banned").value = (p.banned_words || []).join("\n");
    $("s-sensitive").value = (p.sensitive_words || []).join("\n");
    $("s-mode").value = p.mode || "suggest";
    $("shop-saved").textContent = "";
  }

  async function saveShop(ev) {
    ev.preventDefault();
    if (!editing) return;
    const body = Object.assign({}, editing, {
      persona: $("s-persona").value,
      lang: $("s-lang").value,
      banned_words: lines($("s-banned").value),
      sensitive_words: lines($("s-sensitive").value),
      mode: $("s-mode").value,
    });
    const r = await api("PUT", "/v1/shops/" + encodeURIComponent(editing.shop_id), body);
    if (!r.ok) {
      $("shop-saved").textContent = t("error", { msg: r.error });
      return;
    }
    $("shop-saved").textContent = t("saved");
    const i = shops.indexOf(editing);
    editing = r.data && typeof r.data === "object" ? r.data : body;
    if (i >= 0) shops[i] = editing;
  }

  /* ---- views -------------------------------------------------------------------------- */

  const VIEWS = ["inbox", "jobs", "live", "shops"];
  let timer = null;

  function currentView() {
    const v = location.hash.replace(/^#/, "");
    return VIEWS.includes(v) ? v : "inbox";
  }

  function show() {
    const v = currentView();
    for (const name of VIEWS) {
      $("view-" + name).hidden = name !== v;
      $("tab-" + name).classList.toggle("active", name === v);
    }
    clearInterval(timer);
    timer = null;
    if (v === "inbox") loadInbox(false);
    else if (v === "jobs") { loadJobs(); timer = setInterval(loadJobs, JOBS_PERIOD_MS); }
    else if (v === "live") { pollLive(); timer = setInterval(pollLive, LIVE_PERIOD_MS); }
    else if (v === "shops") loadShops();
  }

  function init() {
    applyLang();
    buildCharts();
    $("lang-switch").addEventListener("click", () => {
      lang = lang === "zh" ? "en" : "zh";
      localStorage.setItem(LANG_STORE, lang);
      applyLang();
      buildCharts();
      drawCharts();
      show();
    });
    $("key-button").addEventListener("click", () => { keyAsked = false; askKey(); });
    $("key-form").addEventListener("submit", () => {
      const k = $("key-input").value.trim();
      if (k) sessionStorage.setItem(KEY_STORE, k);
      else sessionStorage.removeItem(KEY_STORE);
      keyAsked = false;
      show();
    });
    $("inbox-filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadInbox(false); });
    for (const id of ["f-rating", "f-sentiment"]) $(id).addEventListener("change", () => loadInbox(false));
    $("inbox-more").addEventListener("click", () => loadInbox(true));
    $("shop-form").addEventListener("submit", saveShop);
    document.addEventListener("keydown", onKey);
    window.addEventListener("hashchange", show);
    /* the shop list for the inbox filter, when the shops API is there */
    api("GET", "/v1/shops").then((r) => {
      if (!r.ok || !r.data || !Array.isArray(r.data.data)) return;
      const dl = $("shop-list");
      for (const p of r.data.data) dl.append(el("option", { value: p.shop_id }));
    });
    show();
  }

  /* for the browser tests and the curious: the state, read-only */
  window.autoreplyConsole = { inbox, series, t, lang: () => lang };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
