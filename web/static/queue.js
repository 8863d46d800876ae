// The queue dashboard: renders /queue.json (embedded in the page at first) and polls it. Prompts and user names are
// untrusted text: they only go into the page as text nodes, never as HTML.
"use strict";

const COLOR = { blue: "#2458c6", green: "#1f7a3a", red: "#b42318", grey: "#8a94a0", amber: "#b07a00" };

/** An element with properties (className, textContent, href…) and children (nodes or text). */
function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children.filter((child) => child != null));
  return node;
}

function secs(s) {
  if (s == null) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 120) return `${Math.round(s)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function num(n) {
  return n >= 10000 ? `${(n / 1000).toFixed(0)}k` : n >= 1000 ? `${(n / 1000).toFixed(1)}k` : String(+n.toFixed(2));
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

/** A table with one column per [heading, cell(row)], or `empty` when there is no row. */
function table(columns, rows, empty) {
  if (!rows.length) return el("p", { className: "hint", textContent: empty });
  const head = el("tr", {}, ...columns.map(([heading]) => el("th", { textContent: heading })));
  const body = rows.map((row) => el("tr", {}, ...columns.map(([, cell]) => el("td", {}, cell(row) ?? ""))));
  return el("table", { className: "board" }, el("thead", {}, head), el("tbody", {}, ...body));
}

/** A job the viewer may see: its prompt (a link to its page if it is theirs), its id beneath. */
function jobCell(job) {
  const prompt = el(job.url ? "a" : "span", { textContent: job.prompt });
  if (job.url) prompt.href = job.url;
  return el("div", { className: "job-cell" }, prompt, el("code", { className: "job-id", textContent: job.id }));
}

function cancelCell(job) {
  if (!job.cancel_url) return null;
  const button = el("button", { type: "button", className: "cancel small", textContent: "Cancel" });
  button.dataset.cancel = job.cancel_url;
  return button;
}

function badge(text, state) {
  const span = el("span", { className: "badge", textContent: text });
  span.dataset.status = state;
  return span;
}

/** The last hour as a line plot on `canvas`: one line per series ({label, color, value(minute)}), 0 at the bottom. */
function plot(canvas, minutes, series, format) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  const [left, right, top, bottom] = [42, 8, 8, 18];
  const values = series.flatMap((s) => minutes.map(s.value)).filter((v) => v != null);
  const peak = Math.max(0, ...values);
  const step = 10 ** Math.floor(Math.log10(peak || 1));
  const max = [1, 2, 5, 10].map((k) => k * step).find((v) => v >= peak) || 1;
  const x = (i) => left + (i / (minutes.length - 1)) * (w - left - right);
  const y = (v) => top + (1 - v / max) * (h - top - bottom);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#5c6670";
  g.strokeStyle = "#e3e7ec";
  g.lineWidth = 1;
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (const f of [0, 0.5, 1]) {
    const at = Math.round(y(max * f)) + 0.5;
    g.beginPath();
    g.moveTo(left, at);
    g.lineTo(w - right, at);
    g.stroke();
    g.fillText(format(max * f), left - 5, at);
  }
  g.textBaseline = "alphabetic";
  for (const [i, label, align] of [[0, "−60 min", "left"], [30, "−30 min", "center"], [59, "now", "right"]]) {
    g.textAlign = align;
    g.fillText(label, x(i), h - 4);
  }
  for (const s of series) {
    g.strokeStyle = g.fillStyle = s.color;
    g.lineWidth = 1.75;
    g.setLineDash(s.dash ? [4, 3] : []);
    g.beginPath();
    let drawing = false;
    minutes.forEach((m, i) => {
      const v = s.value(m);
      if (v == null) return void (drawing = false);
      if (drawing) g.lineTo(x(i), y(v));
      else g.moveTo(x(i), y(v));
      drawing = true;
    });
    g.stroke();
    minutes.forEach((m, i) => { // a dot on each point with data, so that a lone minute shows
      const v = s.value(m);
      if (v != null && (v > 0 || s.dots)) g.fillRect(x(i) - 1.5, y(v) - 1.5, 3, 3);
    });
  }
}

/** A plot's caption: its title, a key per series, and a summary. */
function caption(node, title, series, summary) {
  const keys = series.map((s) => {
    const swatch = el("span", { className: "swatch" });
    swatch.style.background = s.color;
    return el("span", { className: "key" }, swatch, s.label);
  });
  node.replaceChildren(el("strong", { textContent: title }), ...keys,
    el("span", { className: "summary", textContent: summary }));
}

class Dashboard {
  constructor(root, board) {
    this.root = root;
    this.url = root.dataset.url;
    this.pollMs = Number(root.dataset.pollMs) || 2000;
    this.$ = (id) => document.getElementById(id);
    root.addEventListener("click", (e) => {
      const button = e.target.closest("button[data-cancel]");
      if (button) this.cancel(button);
    });
    // While the pointer is on a table of jobs its rows hold still: a redraw would move the Cancel buttons under it
    // (a job above ended) and a click could land on another job's. The newest board is drawn when it leaves.
    this.pointing = false;
    this.held = null;
    for (const id of ["running", "waiting"]) {
      this.$(id).addEventListener("pointerenter", () => { this.pointing = true; });
      this.$(id).addEventListener("pointerleave", () => {
        this.pointing = false;
        if (this.held) this.render(this.held);
      });
    }
    window.addEventListener("resize", () => this.plots());
    this.render(board);
    this.schedule();
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), this.pollMs);
  }

  async refresh() {
    try {
      const response = await fetch(this.url, { headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error((await response.json()).error.message);
      const board = await response.json();
      if (this.pointing) this.hold(board);
      else this.render(board);
    } catch (err) {
      this.$("updated").textContent = `Lost contact with the server (${err.message}); retrying…`;
    }
    this.schedule();
  }

  async cancel(button) {
    button.disabled = true;
    button.textContent = "Cancelling…";
    const response = await fetch(button.dataset.cancel, {
      method: "POST", headers: { Accept: "application/json", "X-CSRF-Token": this.root.dataset.csrf },
    }).catch(() => null);
    const notice = this.$("notice");
    const ok = Boolean(response && response.ok);
    button.textContent = ok ? "Cancelled" : "Cancel"; // (its row goes at the next redraw the rows do not hold)
    button.disabled = ok;
    notice.hidden = ok;
    if (!ok) {
      const body = response && (await response.json().catch(() => null));
      notice.textContent = `Could not cancel: ${body ? body.error.message : "the server could not be reached"}.`;
    }
    this.refresh();
  }

  /** A newer board while the rows hold still: kept for when the pointer leaves, and said. */
  hold(b) {
    this.held = b;
    const at = new Date(b.now * 1000).toLocaleTimeString();
    this.$("updated").textContent = `Held while you point at a job · newer data from ${at} shows when you move away`;
  }

  render(b) {
    this.board = b;
    this.held = null;
    const admin = b.viewer.admin;
    this.$("updated").textContent = `Live · updated ${new Date(b.now * 1000).toLocaleTimeString()}`;
    this.$("viewer").textContent = admin
      ? `You are ${b.viewer.name}, an admin: you see every user's jobs and may cancel any of them.`
      : "You see your own jobs by name; other users' jobs are only counted.";
    this.renderLocalApi(b.local_api);
    const hour = (key) => b.minutes.reduce((sum, m) => sum + m[key], 0);
    const live = b.workers.filter((w) => w.worker);
    this.$("tiles").replaceChildren(...[
      ["Waiting", b.waiting.total],
      ["Running", `${b.running.count} / ${b.running.slots || "–"}`],
      ["Tokens/s now", num(live.reduce((sum, w) => sum + w.tok_s, 0))],
      ["Completed, 1 h", hour("completed")],
      ["Failures, 1 h", hour("failed")],
      ["Workers", `${live.filter((w) => w.state === "ok").length} / ${b.workers.length}`],
      ["Prefix cache hits", b.prefix_cache.hit_rate == null ? "–" : `${Math.round(b.prefix_cache.hit_rate * 100)}%`],
      ["Preemptions", b.fairness.preemptions],
    ].map(([label, value]) => el("div", { className: "tile" }, el("span", { textContent: label }),
      el("strong", { textContent: value }))));
    this.renderRunning(b.running, admin);
    this.renderWaiting(b.waiting, admin);
    this.renderWorkers(b);
    this.renderService(b.fairness);
    this.renderBatches(b.batches, admin, b.now);
    this.renderFailures(b.failures, admin, b.now);
    this.plots();
  }

  /** Local mode: why the jobs this machine sent through the API count as another user's here. */
  renderLocalApi(api) {
    const note = this.$("local-api");
    note.hidden = !api;
    if (!api) return;
    const now = api.waiting + api.running
      ? `: ${plural(api.waiting, "job")} waiting and ${api.running} running now` : "";
    note.textContent = "Local mode: this browser is a user of its own, so its prompts stay private from other "
      + "browsers and from API clients. Jobs sent through the API (curl, the SDKs, onelane run) all belong to one "
      + `user, "${api.user}", and count here as another user's${now}.`;
  }

  renderRunning(r, admin) {
    const share = r.slots ? Math.min(1, r.count / r.slots) : 0;
    this.$("occupancy-fill").style.width = `${(share * 100).toFixed(1)}%`;
    this.$("occupancy-text").textContent = r.slots
      ? `${r.count} of ${plural(r.slots, "slot")} busy (${Math.round(share * 100)}%)`
      : `${r.count} running, no live worker`;
    const columns = [["Job", jobCell], ...(admin ? [["Owner", (j) => j.owner]] : []), ["Model", (j) => j.model],
      ["Tokens", (j) => `${j.tokens.toLocaleString("en")} / ${j.max_tokens.toLocaleString("en")}`],
      ["Speed", (j) => (j.tok_s == null ? "–" : `${j.tok_s} tok/s`)], ["Running for", (j) => secs(j.running_s)],
      ["Device", (j) => j.device], ["", cancelCell]];
    const o = r.others;
    const others = o.jobs ? `+ ${plural(o.jobs, "job")} of ${plural(o.users, "other user")}` : null;
    const empty = r.count ? "None of the running jobs is yours." : "Nothing runs.";
    this.$("running").replaceChildren(...[table(columns, r.jobs, empty),
      others && el("p", { className: "others", textContent: others })].filter(Boolean));
  }

  renderWaiting(w, admin) {
    const columns = [["#", (j) => j.position], ["Job", jobCell], ...(admin ? [["Owner", (j) => j.owner]] : []),
      ["Model", (j) => j.model], ["Priority", (j) => j.priority], ["Waited", (j) => secs(j.waited_s)],
      ["", cancelCell]];
    const n = w.others.length, one = n === 1 && w.others[0] === 1;
    const others = n ? `${plural(n, "other user")}: ${w.others.join(", ")} ${one ? "job" : "jobs"}` : null;
    const more = w.total > w.listed ? `… and ${w.total - w.listed} more waiting beyond these.` : null;
    const empty = w.total ? "None of the waiting jobs is yours." : "Nothing waits.";
    this.$("waiting").replaceChildren(...[table(columns, w.jobs, empty),
      others && el("p", { className: "others", id: "waiting-others", textContent: others }),
      more && el("p", { className: "hint", textContent: more })].filter(Boolean));
  }

  renderWorkers(b) {
    const columns = [["Device", (w) => w.device], ["Health", (w) => badge(w.health, w.state)],
      ["Worker", (w) => (w.worker ? `${w.worker} (pid ${w.pid})` : "no worker holds it")],
      ["Heartbeat", (w) => (w.worker ? `${secs(w.heartbeat_age_s)} ago` : "–")],
      ["Batch", (w) => (w.worker ? `${w.batch} / ${w.slots}` : "–")],
      ["Tokens/s", (w) => (w.worker ? num(w.tok_s) : "–")],
      ["Prefix cache", (w) => (w.worker ? `${w.cache_entries} ${w.cache_entries === 1 ? "entry" : "entries"}, ${(w.cache_bytes / 2 ** 20).toFixed(1)} MiB`
        : "–")],
      ["Models", (w) => (w.worker ? (w.models.join(", ") || "none loaded") + (w.loading ? `, loading ${w.loading}` : "")
        : "–")]];
    this.$("workers").replaceChildren(table(columns, b.workers, "No worker has been seen: start one (onelane worker)"));
    const models = b.models.map((m) => `${m.name} ${m.state}, ${m.waiting} waiting`);
    this.$("models").textContent = `Models: ${models.join(" · ")}`;
  }

  renderService(f) {
    const who = (x) => (x.owner == null ? el("span", { className: "hint", textContent: "another user" })
      : x.mine ? `${x.owner} (you)` : x.owner);
    const columns = [["User", who], ["Class", (x) => x.priority], ["Tokens", (x) => x.tokens.toLocaleString("en")]];
    this.$("service").replaceChildren(table(columns, f.flows, "No job has ended yet."));
  }

  renderBatches(b, admin, now) {
    const done = (x) => x.completed + x.failed;
    const columns = [["Batch", (x) => x.id], ...(admin ? [["Owner", (x) => x.owner]] : []),
      ["Status", (x) => badge(x.status, x.status === "cancelling" ? "warn" : "ok")], ["Endpoint", (x) => x.endpoint],
      ["Done", (x) => `${done(x).toLocaleString("en")} / ${x.total.toLocaleString("en")}`],
      ["Completed", (x) => x.completed.toLocaleString("en")], ["Failed", (x) => x.failed.toLocaleString("en")],
      ["Running for", (x) => secs(now - x.created_at)]];
    const o = b.others;
    const others = o.batches ? `+ ${o.batches} ${o.batches === 1 ? "batch" : "batches"} of ${plural(o.users, "other user")}` : null;
    this.$("batches").replaceChildren(...[table(columns, b.batches, o.batches ? "None of the batches is yours." :
      "No batch runs."), others && el("p", { className: "others", id: "batches-others", textContent: others })]
      .filter(Boolean));
  }

  renderFailures(failures, admin, now) {
    const what = (f) => (f.id ? jobCell(f) : el("span", { className: "hint", textContent: "another user's job" }));
    const columns = [["When", (f) => `${secs(now - f.at)} ago`], ["Status", (f) => badge(f.status, f.status)],
      ["Error", (f) => f.error], ["Model", (f) => f.model], ["Job", what],
      ...(admin ? [["Owner", (f) => f.owner]] : []), ["Message", (f) => f.message]];
    this.$("failures").replaceChildren(table(columns, failures, "No recent failures."));
  }

  plots() {
    const m = this.board.minutes;
    const sum = (key) => m.reduce((total, x) => total + (x[key] || 0), 0);
    const tokens = [{ label: "tokens/s", color: COLOR.blue, value: (x) => x.tok_s }];
    plot(this.$("plot-tokens"), m, tokens, num);
    caption(this.$("caption-tokens"), "Throughput", tokens, `${num(sum("tokens"))} tokens in the last hour`);
    this.$("plot-tokens").dataset.total = sum("tokens");
    const jobs = [
      { label: "completed", color: COLOR.green, value: (x) => x.completed },
      { label: "failed", color: COLOR.red, value: (x) => x.failed },
      { label: "admitted", color: COLOR.grey, value: (x) => x.admitted, dash: true },
    ];
    plot(this.$("plot-jobs"), m, jobs, num);
    caption(this.$("caption-jobs"), "Jobs per minute", jobs,
      `${sum("completed")} completed, ${sum("failed")} failed or expired`);
    this.$("plot-jobs").dataset.total = sum("completed");
    const waits = [
      { label: "mean", color: COLOR.blue, value: (x) => x.wait_mean_s, dots: true },
      { label: "longest", color: COLOR.amber, value: (x) => x.wait_max_s, dots: true },
    ];
    plot(this.$("plot-wait"), m, waits, secs);
    const started = sum("started");
    const mean = started ? secs(m.reduce((t, x) => t + (x.wait_mean_s || 0) * x.started, 0) / started) : "–";
    caption(this.$("caption-wait"), "Queue wait", waits, `${plural(started, "job")} started, ${mean} on average`);
    this.$("plot-wait").dataset.total = started;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("dashboard");
  if (root) new Dashboard(root, JSON.parse(document.getElementById("queue-data").textContent));
});
