// console.mjs - the console at /console in Debian's Chromium (headless, 1280x800) against a
// running `autoreply serve` (tests/cli/console_browser_test.c starts it and runs this):
//   node tests/browser/console.mjs --base http://127.0.0.1:PORT --out DIR
// Fails (exit 1) on any JavaScript exception or console error in the page. Checks the live
// view draws its charts from /v1/stats, the jobs view lists a job made through the API with
// its progress and gives its results as CSV, the language switch, and, when the review
// workflow API is there (GET /v1/reviews answers 200), that a pending review made through the
// API shows in the inbox and, edited and approved with the keyboard, is approved with the
// edited text as the API then tells. Without that API the inbox must show the API's error.
// With --key KEY (a server with API keys) the page must ask for the key first (the API's 401),
// and work once it is given. Screenshots go to DIR.
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const base = args.base;
const out = args.out || "build/browser";
const key = args.key || "";
const chromePath = args.chromium || process.env.AR_CHROMIUM || "/usr/bin/chromium";
if (!base) {
  console.error("usage: node console.mjs --base http://127.0.0.1:PORT --out DIR");
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });

let passed = 0;
let failed = 0;
function check(cond, what) {
  if (cond) {
    passed++;
    console.log("ok   " + what);
  } else {
    failed++;
    console.log("FAIL " + what);
  }
}

async function apiJson(method, p, body, type) {
  const headers = body === undefined ? {} : { "Content-Type": type || "application/json" };
  if (key) headers.Authorization = "Bearer " + key;
  const r = await fetch(base + p, {
    method,
    headers,
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  let data = null;
  try { data = await r.json(); } catch (e) { /* not JSON */ }
  return { status: r.status, data };
}

async function until(fn, timeoutMs, what) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const workflow = (await apiJson("GET", "/v1/reviews?status=pending&limit=1")).status === 200;
console.log("review workflow API: " + (workflow ? "present" : "absent"));

// a pending review (default profile: mode "suggest") and a job, made before the page loads
const shop = "browser-shop";
const reviewId = "browser-" + Date.now();
if (workflow) {
  const r = await apiJson("POST", "/v1/reviews/reply",
    { shop_id: shop, id: reviewId, text: "包装很好，就是快递有点慢", rating: 4 });
  check(r.status === 200 && r.data && r.data.action === "suggest", "POST /v1/reviews/reply makes a suggestion (" + r.status + ")");
}
const job = await apiJson("POST", "/v1/jobs", '{"shop_id":"' + shop + '","id":"j1","text":"很好吃","rating":5}\n' +
  '{"shop_id":"' + shop + '","id":"j2","text":"size runs small","rating":3}\n', "application/x-ndjson");
check(job.status === 202 && job.data && job.data.id, "POST /v1/jobs accepted (" + job.status + ")");
const jobId = job.data && job.data.id;
await until(async () => {
  const j = await apiJson("GET", "/v1/jobs/" + jobId);
  return j.data && (j.data.status === "done" || j.data.status === "failed");
}, 120000, "the job to finish");

const browser = await chromium.launch({
  executablePath: chromePath,
  headless: true,
  // root in CI: Chromium's sandbox needs an unprivileged user; the closed network: no
  // background connections (they fail and log)
  args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--disable-quic"],
});
const errors = [];
let keyGiven = !key;
try {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 }, locale: "en-US", acceptDownloads: true });
  const page = await ctx.newPage();
  page.on("pageerror", (e) => errors.push("exception: " + e.message));
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    const url = (m.location() && m.location().url) || "";
    // Chromium logs every non-2xx fetch as a console error; without the workflow API its
    // routes are expected to answer 404, and the page shows that (checked below)
    if (!workflow && /Failed to load resource/.test(m.text()) && /\/v1\/(reviews|shops)/.test(url)) return;
    // and before the key is given, the API's 401 is what makes the page ask for it
    if (!keyGiven && /Failed to load resource.*401/.test(m.text())) return;
    errors.push("console: " + m.text() + " " + url);
  });

  // ---- live -------------------------------------------------------------------------------
  await page.goto(base + "/console#live");
  if (key) {
    await page.waitForSelector("#key-dialog[open]", { timeout: 10000 });
    check(true, "key: the page asks for the API key");
    await page.fill("#key-input", key);
    await page.click("#key-form button");
    check(await page.evaluate(() => sessionStorage.getItem("autoreply.key")) === key, "key: kept in sessionStorage");
  }
  await page.waitForFunction(() => /Updated/.test(document.getElementById("live-status").textContent), null, { timeout: 15000 });
  keyGiven = true; // every 401 of the page before this was before the key
  check(await page.locator("#charts figure.chart").count() === 5, "live view: five charts");
  await page.waitForFunction(() => window.autoreplyConsole.series.rps.length >= 2, null, { timeout: 15000 });
  const pts = await page.locator("#chart-rps polyline").getAttribute("points");
  check(pts && pts.split(" ").length >= 2, "live view: the requests/s chart has points (" + pts + ")");
  const savings = await page.locator("#savings dd").count();
  check(savings === 3, "live view: the cache's savings");
  const stats = (await apiJson("GET", "/v1/stats")).data;
  check(stats && stats.totals && stats.totals.model_calls >= 2, "/v1/stats counts the job's model calls");
  await page.screenshot({ path: path.join(out, "console-live.png") });

  // ---- jobs -------------------------------------------------------------------------------
  await page.goto(base + "/console#jobs");
  const row = page.locator("#jobs-table tbody tr", { hasText: jobId });
  await row.waitFor({ timeout: 10000 });
  check(await row.locator(".bar .fill").count() === 1, "jobs view: the job with a progress bar");
  check((await row.locator(".count").textContent()).trim() === "2 / 2", "jobs view: 2 / 2 lines done");
  const [dl] = await Promise.all([page.waitForEvent("download"), row.getByRole("button", { name: "CSV" }).click()]);
  const csvPath = path.join(out, "job.csv");
  await dl.saveAs(csvPath);
  const csv = fs.readFileSync(csvPath, "utf8").replace(/^\ufeff/, "").trim().split(/\r\n/);
  check(csv.length === 3 && csv[0].split(",").includes("line"), "jobs view: CSV with a header and 2 rows");
  await page.screenshot({ path: path.join(out, "console-jobs.png") });
  // a job long enough (2000 lines) to be cancelled from the page while it runs
  let long = "";
  // (another shop: its pending replies, newer than the review below, must not push that one off
  // the inbox's first page)
  for (let i = 0; i < 2000; i++) long += JSON.stringify({ shop_id: shop + "-bulk", id: "long-" + i, text: "第" + i + "次买了，味道不错", rating: 4 }) + "\n";
  const lj = await apiJson("POST", "/v1/jobs", long, "application/x-ndjson");
  check(lj.status === 202, "a long job accepted (" + lj.status + ")");
  await page.click("#tab-inbox");
  await page.click("#tab-jobs");
  const lrow = page.locator("#jobs-table tbody tr", { hasText: lj.data.id });
  await lrow.getByRole("button", { name: "Cancel" }).click();
  const cancelled = await until(async () => {
    const j = await apiJson("GET", "/v1/jobs/" + lj.data.id);
    return j.data && j.data.status !== "queued" && j.data.status !== "running" && j.data.status;
  }, 10000, "the long job to stop");
  check(cancelled === "cancelled", "jobs view: Cancel cancels the running job (" + cancelled + ")");
  await apiJson("DELETE", "/v1/jobs/" + lj.data.id + "?purge=true");

  // ---- inbox ------------------------------------------------------------------------------
  await page.goto(base + "/console#inbox");
  if (workflow) {
    // the shop filter: only this shop's pending reviews
    await page.fill("#f-shop", shop);
    await page.click("#inbox-filters button[type=submit]");
    await page.waitForFunction((s) => {
      const cards = document.querySelectorAll("#inbox-list li.card");
      return cards.length > 0 && [...cards].every((c) => c.textContent.includes(s + " /"));
    }, shop, { timeout: 10000 });
    check(true, "inbox: the shop filter shows only " + shop);
    const card = page.locator("#inbox-list li.card", { hasText: reviewId });
    await card.waitFor({ timeout: 10000 });
    check(true, "inbox: the pending review shows");
    await page.screenshot({ path: path.join(out, "console.png") });
    const edited = "谢谢您的评价，我们会督促快递加快速度！(edited " + reviewId + ")";
    await card.locator(".meta").click();
    await card.locator("textarea").fill(edited);
    await page.keyboard.press("Escape");
    await page.keyboard.press("a");
    await card.waitFor({ state: "detached", timeout: 10000 });
    const after = await apiJson("GET", "/v1/reviews/" + shop + "/" + reviewId);
    check(after.status === 200 && after.data && (after.data.status === "approved" || after.data.status === "sent"),
      "API: the review is approved (" + (after.data && after.data.status) + ")");
    check(after.data && after.data.reply === edited, "API: with the edited reply");
    check(after.data && Array.isArray(after.data.audit) && after.data.audit.length >= 1, "API: the audit log has the change");
  } else {
    await page.waitForFunction(() => /cannot be read/.test(document.getElementById("inbox-status").textContent), null, { timeout: 10000 });
    check(true, "inbox: shows the API's error without the workflow API");
    await page.screenshot({ path: path.join(out, "console.png") });
  }

  // ---- language ---------------------------------------------------------------------------
  await page.click("#lang-switch");
  check((await page.locator("#tab-inbox").textContent()) === "待审", "language: switches to Chinese");
  await page.click("#lang-switch");
  check((await page.locator("#tab-inbox").textContent()) === "Inbox", "language: and back");
} catch (e) {
  failed++;
  console.log("FAIL " + (e && e.stack ? e.stack : e));
} finally {
  await browser.close();
}
check(errors.length === 0, "no JavaScript or console error" + (errors.length ? ":\n  " + errors.join("\n  ") : ""));
console.log("browser checks: " + passed + " ok, " + failed + " failed");
process.exit(failed ? 1 : 0);
