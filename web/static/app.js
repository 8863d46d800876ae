// onelane's pages: the live job page, a chat's thread that continues in place, and local times. Model output and prompts are untrusted text:
// they only ever go into the page through textContent or text nodes, never as HTML.
"use strict";

const ENDED = new Set(JSON.parse(document.body.dataset.ended)); // the ended statuses, from tasks/job.py
const RESTARTING = "the worker stopped; it will go on where it was";

/** A duration in seconds, readable: "0.42 s", "12.3 s", "2 min 5 s". */
function duration(s) {
  if (s < 10) return `${s.toFixed(2)} s`;
  if (s < 60) return `${s.toFixed(1)} s`;
  const whole = Math.round(s);
  return `${Math.floor(whole / 60)} min ${whole % 60} s`;
}

/** When a waiting job should start, in words: "12 s", "2 min 5 s". */
function startsIn(s) {
  if (s < 1) return "less than a second";
  const whole = Math.round(s);
  return whole < 60 ? `${whole} s` : `${Math.floor(whole / 60)} min ${whole % 60} s`;
}

/** Where a waiting job stands (no ETA while no worker holds the device). */
function queuedText(position, eta) {
  if (position == null) return "Waiting in the queue";
  const where = `#${position} in queue`;
  return eta == null ? `${where}, ETA unknown` : `${where}, about ${startsIn(eta)}`;
}

/** What happened to an ended job, in words. */
function endedText(job) {
  switch (job.status) {
    case "completed":
      return job.finish_reason === "length"
        ? `Completed: reached the limit of ${job.params.max_tokens} tokens.`
        : "Completed: the model finished.";
    case "failed":
      return `Failed: ${job.error ? job.error.message : "unknown error"}`;
    case "cancelled":
      return cancelledText(job);
    case "expired":
      return "Expired: it waited too long in the queue and never started.";
    default:
      return job.status;
  }
}

/** Why a cancelled job ended, and whether it had started. */
function cancelledText(job) {
  const started = job.timings.started_at != null;
  if (job.error && job.error.type === "client_gone") {
    return started
      ? "Cancelled: its client went away while it ran; the output so far is kept."
      : "Cancelled: you left the page before it started.";
  }
  return started ? "Cancelled while running; the output so far is kept." : "Cancelled before it started.";
}

/** The timings of an ended job as [label, value] rows; rows whose moments are missing are left out. */
function timingRows(job) {
  const t = job.timings;
  const tokens = job.usage.completion_tokens;
  const rows = [];
  if (t.started_at != null) rows.push(["Waited in queue", duration(t.started_at - t.queued_at)]);
  if (t.first_token_at != null) rows.push(["Time to first token", duration(t.first_token_at - t.queued_at)]);
  if (t.finished_at != null) rows.push(["Total", duration(t.finished_at - t.queued_at)]);
  rows.push(["Tokens", String(tokens)]);
  if (t.first_token_at != null && t.finished_at != null && t.finished_at > t.first_token_at) {
    rows.push(["Speed", `${(tokens / (t.finished_at - t.first_token_at)).toFixed(1)} tokens/s`]);
  }
  if (isFollowUp(job)) rows.push(["From the prefix cache", cachedText(job)]);
  return rows;
}

/** A chat turn that continues earlier ones: its history holds an assistant's answer. */
function isFollowUp(job) {
  return (job.messages || []).some((m) => m.role === "assistant");
}

/** How much of a job's prompt the worker read from its prefix cache instead of prefilling it. */
function cachedText(job) {
  return `${job.usage.cached_tokens} of ${job.usage.prompt_tokens} prompt tokens`;
}

/** An element with properties and children, built without HTML: model text stays text. */
function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

/** One job's page: its status, its output as it streams, a cancel button, and timings once it ended. */
class JobPage {
  constructor(root, job) {
    this.root = root;
    this.status = document.getElementById("status");
    this.note = document.getElementById("note");
    this.output = document.getElementById("output");
    this.timings = document.getElementById("timings");
    this.timingsSection = document.getElementById("timings-section");
    this.cancelButton = document.getElementById("cancel");
    this.lastIndex = -1; // the last started/token event shown: a replayed one is skipped
    this.tokens = 0;
    this.source = null;
    if (ENDED.has(job.status)) {
      this.end(job);
      return;
    }
    this.queued = null; // the last standing told, and when: its ETA counts down between two
    if (job.status === "queued") this.showQueued(job.position, job.eta_s);
    else this.setStatus(job.status, "Running…");
    this.output.textContent = ""; // the stream replays every token from the start
    this.cancelButton.addEventListener("click", () => this.cancel());
    this.follow();
  }

  setStatus(status, text) {
    this.status.dataset.status = status;
    this.status.textContent = text;
  }

  setNote(text) {
    this.note.textContent = text;
    this.note.hidden = !text;
  }

  /** Listen to the job's events until its terminal one. */
  follow() {
    const source = new EventSource(this.root.dataset.eventsUrl);
    this.source = source;
    source.addEventListener("open", () => this.setNote(""));
    source.addEventListener("queued", (e) => {
      const data = JSON.parse(e.data);
      this.showQueued(data.position, data.eta_s);
    });
    source.addEventListener("started", (e) => this.onStarted(JSON.parse(e.data)));
    source.addEventListener("token", (e) => this.onToken(JSON.parse(e.data)));
    source.addEventListener("requeued", (e) => this.onRequeued(JSON.parse(e.data)));
    for (const name of ENDED) source.addEventListener(name, (e) => this.end(JSON.parse(e.data)));
    source.addEventListener("error", () => {
      if (source.readyState === EventSource.CLOSED) this.setNote("Lost the live feed. Reload the page to see the job.");
      else this.setNote("Reconnecting…");
    });
  }

  /** The job waits: its place, and its ETA counting down each second until the server tells a new one. */
  showQueued(position, eta) {
    this.queued = { position, eta, at: performance.now() };
    this.tickQueued();
    if (!this.ticker) this.ticker = setInterval(() => this.tickQueued(), 1000);
  }

  tickQueued() {
    if (!this.queued) return;
    const { position, eta, at } = this.queued;
    const left = eta == null ? null : Math.max(eta - (performance.now() - at) / 1000, 0);
    const where = queuedText(position, left);
    this.setStatus("queued", this.restarting ? `${where} (${RESTARTING})` : where);
  }

  /** True for an event not shown yet; the browser resumes after the last id, this guards against replays. */
  fresh(index) {
    if (index <= this.lastIndex) return false;
    this.lastIndex = index;
    return true;
  }

  onStarted(data) {
    if (!this.fresh(data.index)) return;
    this.restarting = false;
    this.queued = null;
    this.setStatus("in_progress", "Running…");
  }

  onToken(data) {
    if (!this.fresh(data.index)) return;
    this.output.append(document.createTextNode(data.text));
    this.tokens += data.n;
    this.setStatus("in_progress", `Running: ${this.tokens} token${this.tokens === 1 ? "" : "s"} so far`);
  }

  /** The worker stopped mid-run: the job waits again at the front, and its next run goes on where it was. */
  onRequeued(data) {
    if (!this.fresh(data.index)) return; // its output so far stays: the next run writes only what follows
    this.restarting = true;
    this.queued = null;  // until it starts again, its place in the queue says why it waits again
    this.setStatus("queued", `Back at the front of the queue: ${RESTARTING}.`);
  }

  /** Show the ended job as the server has it, and stop listening. */
  end(job) {
    this.job = job;
    if (this.source) this.source.close();
    clearInterval(this.ticker);
    this.queued = null;
    this.setNote("");
    this.setStatus(job.status, endedText(job));
    this.output.textContent = job.output;
    if (this.cancelButton) this.cancelButton.remove();
    this.timings.replaceChildren();
    for (const [label, value] of timingRows(job)) {
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = label;
      dd.textContent = value;
      this.timings.append(dt, dd);
    }
    this.timingsSection.hidden = false;
    if (this.onEnd) this.onEnd(job);
  }

  /** Ask the server to cancel; the job's end arrives in the answer or, for a running job, on the stream. */
  async cancel() {
    this.cancelButton.disabled = true;
    this.cancelButton.textContent = "Cancelling…";
    try {
      const response = await fetch(this.root.dataset.cancelUrl, {
        method: "DELETE",
        headers: { Accept: "application/json", "X-CSRF-Token": this.root.dataset.csrf },
      });
      const body = await response.json();
      if (response.ok && ENDED.has(body.status)) this.end(body);
      else if (!response.ok && response.status !== 409) this.cancelFailed(body.error.message);
    } catch (err) {
      this.cancelFailed("the server could not be reached");
    }
  }

  cancelFailed(reason) {
    this.setNote(`Could not cancel: ${reason}.`);
    this.cancelButton.disabled = false;
    this.cancelButton.textContent = "Cancel";
  }
}

/** A completed chat's follow-up, sent without leaving the page: the answer becomes a turn of the thread, the new
 * message another, and the new job is followed in place (its events, its cancel button) as any job's page does.
 * Without the script the form posts and the server sends the browser to the new job's page: the same thread. */
class Conversation {
  constructor(root, form, job) {
    this.root = root;
    this.form = form;
    this.text = form.querySelector("textarea");
    this.send = form.querySelector("button[type=submit]");
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.submit();
    });
    this.text.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { // Enter sends, Shift+Enter is a new line
        e.preventDefault();
        form.requestSubmit();
      }
    });
    this.follow(job);
    window.addEventListener("popstate", () => window.location.reload()); // back to an earlier turn's own page
  }

  follow(job) {
    this.page = new JobPage(this.root, job);
    this.page.onEnd = (ended) => this.ended(ended);
    if (ENDED.has(job.status)) this.ended(job);
  }

  ended(job) {
    this.form.hidden = job.status !== "completed";
    if (!this.form.hidden && document.activeElement === document.body) this.text.focus();
  }

  async submit() {
    this.send.disabled = true;
    this.form.querySelector(".alert")?.remove();
    try {
      const response = await fetch(this.form.action, {
        method: "POST",
        body: new FormData(this.form),
        headers: { Accept: "application/json", "X-CSRF-Token": this.root.dataset.csrf },
      });
      const body = await response.json();
      if (response.ok) this.continueWith(body);
      else this.refused(body.error.message);
    } catch (err) {
      this.refused("the server could not be reached");
    } finally {
      this.send.disabled = false;
    }
  }

  refused(message) {
    this.form.querySelector("label").before(el("p", { className: "alert", id: "form-error", role: "alert" }, message));
  }

  /** The answer just given and the new message join the thread; the new job takes the page over. */
  continueWith(next) {
    const done = this.page.job;
    const thread = document.getElementById("prompt");
    const meta = el("p", { className: "turn-meta" }, el("a", { href: window.location.pathname }, done.id), " · ",
      el("span", { className: "cached" }, `${cachedText(done)} from the cache`));
    thread.append(
      this.turn("assistant", done.output, meta),
      this.turn("user", next.job.messages[next.job.messages.length - 1].content),
    );
    this.text.value = "";
    this.form.hidden = true;
    this.form.action = next.continue_url;
    Object.assign(this.root.dataset, { eventsUrl: next.events_url, cancelUrl: next.cancel_url });
    document.getElementById("job-id").textContent = next.job.id;
    document.getElementById("output").textContent = "";
    document.getElementById("timings-section").hidden = true;
    document.getElementById("status").after(el("button", { type: "button", className: "cancel", id: "cancel" }, "Cancel"));
    history.pushState(null, "", next.url);
    this.follow(next.job);
  }

  turn(role, text, ...rest) {
    const li = el("li", { className: "turn" }, el("p", { className: "role" }, role), el("pre", { className: "text" }, text), ...rest);
    li.dataset.role = role;
    return li;
  }
}

/** Show each <time datetime> in the visitor's time zone. */
function localTimes() {
  for (const el of document.querySelectorAll("time[datetime]")) {
    el.textContent = new Date(el.dateTime).toLocaleString();
  }
}

/** Keep the form's notice about the default model (loading, or unable to load) as /readyz tells it, every 2 s,
 * until the model is ready: then the notice goes. */
function watchModelNotice() {
  const notice = document.getElementById("model-notice");
  if (!notice) return;
  const look = async () => {
    try {
      const reply = await fetch(notice.dataset.readyz, { headers: { Accept: "application/json" } });
      const body = await reply.json();
      if (reply.ok) {
        notice.remove();
        return;
      }
      if (body.model) {
        const why = body.error.message;
        notice.textContent = `${why[0].toUpperCase()}${why.slice(1)}: a job waits until it is ready.`;
      }
    } catch (e) {
      // the server is away for a moment: look again
    }
    setTimeout(look, 2000);
  };
  setTimeout(look, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes();
  watchModelNotice();
  const root = document.getElementById("job");
  const data = document.getElementById("job-data");
  if (!root || !data) return;
  const job = JSON.parse(data.textContent);
  const form = document.getElementById("continue");
  if (form) new Conversation(root, form, job);
  else new JobPage(root, job);
});
