// One job, live: its state, progress, speed and time left, charts of the training loss,
// the validation metrics and the bytes that crossed, its turns, and (for consortium
// admins) the buttons that schedule, pause, resume or cancel it.
//
// Polls every 2 s while the job can still change:
//   GET /api/jobs/<id>/status/          state, round, current turn, totals (fast)
//   GET /api/jobs/<id>/turns/           every turn with its counters and metrics
//   GET /api/jobs/<id>/metrics/?since=  only the metric points not yet seen
//   GET /api/jobs/<id>/                 again only when the state changed (its reason)
// Actions: POST /api/jobs/<id>/schedule|pause|resume|cancel/ {reason}.

import { api, apiAll } from "../api.js";
import { every, isConsortiumAdmin } from "../app.js";
import { ago, badge, bytes, duration, el, table, toast } from "../ui.js";

const POLL_SECONDS = 2;
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
// Which states each action may leave from (platform/training/states.py TRANSITIONS).
const ACTIONS = [
  { name: "schedule", label: "Schedule", from: ["draft"], done: "scheduled" },
  { name: "pause", label: "Pause", from: ["running"], done: "paused" },
  { name: "resume", label: "Resume", from: ["paused"], done: "resumed" },
  { name: "cancel", label: "Cancel job", from: ["draft", "scheduled", "running", "paused"], done: "cancelled" },
];
const COLOURS = ["#1f5fbf", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207", "#be185d"];
const DASHES = [[], [6, 3], [2, 3], [10, 4, 2, 4]];
// Overlap of incremental metric fetches: a point can be stored with a time slightly
// before another that was already read; the overlap (and de-duplication) catches it.
const SINCE_OVERLAP_MS = 10_000;
const RATE_WINDOW_S = 60;



const whole = new Intl.NumberFormat();
const fixed = (n, digits = 4) => (n === null || n === undefined ? "–" : Number(n).toFixed(digits));
// Of another hospital's turns a hospital admin gets the place, state and sample count
// only (platform/kernel/permissions.py): every other field may be absent.
const known = (n) => typeof n === "number";
const count = (n) => (known(n) ? whole.format(n) : "–");
const bytesOf = (t) => (known(t.bytes_up) ? `${bytes(t.bytes_up)} / ${bytes(t.bytes_down)}` : "–");

function optimizerText(config) {
  if (!config || !Object.keys(config).length) return "default";
  const { name = "sgd", ...rest } = config;
  return `${name} (${Object.entries(rest).map(([k, v]) => `${k} ${Array.isArray(v) ? v.join("/") : v}`).join(", ")})`;
}

function metricsText(metrics) {
  const entries = Object.entries(metrics || {});
  if (!entries.length) return "–";
  return entries
    .map(([k, v]) => `${k.replace(/^val_/, "val ")} ${Number.isInteger(v) ? v : Number(v).toFixed(4)}`)
    .join(", ");
}

/** Steps per second from a turn's points over the last RATE_WINDOW_S seconds. */
function recentRate(points) {
  if (!points || points.length < 2) return null;
  const last = points[points.length - 1];
  const lastTime = Date.parse(last.time);
  let first = points[0];
  for (let i = points.length - 2; i >= 0; i -= 1) {
    first = points[i];
    if (lastTime - Date.parse(points[i].time) >= RATE_WINDOW_S * 1000) break;
  }
  const seconds = (lastTime - Date.parse(first.time)) / 1000;
  if (seconds <= 0 || last.step <= first.step) return null;
  return (last.step - first.step) / seconds;
}

/** Steps per second over every turn: steps between each turn's first and last point. */
function averageRate(pointsByTurn) {
  let steps = 0;
  let seconds = 0;
  for (const points of pointsByTurn.values()) {
    if (points.length < 2) continue;
    const first = points[0];
    const last = points[points.length - 1];
    steps += last.step - first.step;
    seconds += (Date.parse(last.time) - Date.parse(first.time)) / 1000;
  }
  return seconds > 0 && steps > 0 ? steps / seconds : null;
}

/** A round's name on the validation chart (indices count from 0, people from 1). */
const roundName = (index) => `round ${index + 1}`;

function canvas(testid, label) {
  return el("canvas", { "data-testid": testid, role: "img", "aria-label": label });
}

export async function render(root, [id], session) {
  const jobId = Number(id);
  let job = await api(`jobs/${jobId}/`); // a 404 becomes the router's "Not found"
  const admin = isConsortiumAdmin();
  const names = new Map((job.participants || []).map((p) => [p.hospital, p.hospital_name]));
  const hospitalName = (slug) => names.get(slug) || slug;

  // -- the page ----------------------------------------------------------------------
  const title = el("h1", {}, job.name || `Job ${job.id}`);
  const stateBadge = el("span", { "data-testid": "job-state", class: "badge" });
  const stateReason = el("span", { class: "muted" });
  const stateSince = el("span", { class: "muted" });
  const head = el(
    "div",
    { class: "job-head", role: "status", "aria-live": "polite" },
    el("span", {}, "State: "),
    stateBadge,
    stateReason,
    stateSince,
  );

  const buttons = new Map();
  const reason = el("input", { id: "job-action-reason", name: "reason", maxlength: "2000", placeholder: "recorded in the audit log" });
  const actionError = el("p", { class: "form-error", role: "alert" });
  const controls = admin
    ? el(
        "div",
        { class: "job-controls" },
        el(
          "div",
          { class: "field" },
          el("label", { for: reason.id }, "Reason (optional)"),
          reason,
        ),
        ACTIONS.map((action) => {
          const button = el(
            "button",
            {
              type: "button",
              "data-testid": action.name,
              class: action.name === "cancel" ? "danger" : action.name === "schedule" ? null : "secondary",
              onclick: () => act(action),
            },
            action.label,
          );
          buttons.set(action.name, button);
          return button;
        }),
        actionError,
      )
    : null;

  const stat = (heading, testid) => {
    const value = el("div", { class: "stat", "data-testid": testid || null }, "–");
    const sub = el("div", { class: "sub" });
    return { node: el("div", { class: "card" }, el("h2", {}, heading), value, sub), value, sub };
  };
  const sRound = stat("Round", "job-round");
  const sTurn = stat("Current turn", "job-turn");
  const sSteps = stat("Steps", "job-steps");
  const sBytes = stat("Bytes up / down", "job-bytes");
  const sRate = stat("Steps per second", "job-rate");
  const sLeft = stat("Time left", "job-eta");
  const sLoss = stat("Last loss", "job-loss");
  const stats = el(
    "section",
    { class: "grid job-stats", "aria-label": "Progress" },
    [sRound, sTurn, sSteps, sBytes, sRate, sLeft, sLoss].map((s) => s.node),
  );

  const lossCanvas = canvas("loss-chart", "Training loss per hospital and round, by step");
  const valCanvas = canvas("validation-chart", "Validation accuracy and loss per hospital, by round");
  const bytesCanvas = canvas("bytes-chart", "Bytes sent up and down over time");
  const chartNote = el("p", { class: "muted" });
  const charts = el(
    "section",
    { "aria-label": "Charts" },
    chartNote,
    el(
      "div",
      { class: "grid job-charts" },
      el("div", { class: "card" }, el("h2", {}, "Training loss"), el("div", { class: "chart-box" }, lossCanvas)),
      el(
        "div",
        { class: "card" },
        el("h2", {}, "Validation accuracy and loss"),
        el("div", { class: "chart-box" }, valCanvas),
      ),
      el("div", { class: "card" }, el("h2", {}, "Bytes up and down"), el("div", { class: "chart-box" }, bytesCanvas)),
    ),
  );

  const turnsBox = el("div", { class: "job-turns" }, el("p", { class: "muted" }, "Loading…"));
  const configBox = el("div", { class: "job-config" });

  root.append(
    el("p", {}, el("a", { href: "#/jobs" }, "← Jobs")),
    title,
    head,
    controls || "", // append(null) would show "null"
    stats,
    el("h2", {}, "Charts"),
    charts,
    el("h2", {}, "Turns"),
    turnsBox,
    el("h2", {}, "Configuration"),
    configBox,
  );

  // -- state -------------------------------------------------------------------------
  let status = null;
  let turns = [];
  const pointsByTurn = new Map(); // turn id -> its points, in step order
  const seen = new Set(); // "turn:step"
  let lastPointTime = null;
  let stopped = false;
  let finalDone = false;
  let stopPoll = () => {};
  let busy = false; // an action is in flight

  // -- charts ------------------------------------------------------------------------
  const Chart = window.Chart;
  let lossChart = null;
  let valChart = null;
  let bytesChart = null;
  const lossSets = new Map(); // turn id -> dataset
  const slugs = (job.participants || []).map((p) => p.hospital);
  const colourOf = (slug) => COLOURS[Math.max(0, slugs.indexOf(slug)) % COLOURS.length];

  function baseOptions(xTitle, yTitle) {
    return {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      interaction: { mode: "nearest", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      scales: {
        x: { type: "linear", title: { display: true, text: xTitle } },
        y: { title: { display: true, text: yTitle } },
      },
    };
  }

  if (Chart) {
    lossChart = new Chart(lossCanvas, {
      type: "line",
      data: { datasets: [] },
      options: baseOptions("step of the turn", "training loss"),
    });
    const valOptions = baseOptions("round", "accuracy");
    valOptions.scales.x = { type: "category", title: { display: true, text: "round" } };
    valOptions.scales.y.min = 0;
    valOptions.scales.y.max = 1;
    valOptions.scales.y1 = {
      position: "right",
      title: { display: true, text: "loss" },
      grid: { drawOnChartArea: false },
    };
    valChart = new Chart(valCanvas, {
      type: "line",
      data: {
        labels: Array.from({ length: job.rounds }, (_, i) => roundName(i)),
        datasets: slugs.flatMap((slug) => [
          {
            label: `accuracy · ${hospitalName(slug)}`,
            data: [],
            yAxisID: "y",
            borderColor: colourOf(slug),
            backgroundColor: colourOf(slug),
          },
          {
            label: `loss · ${hospitalName(slug)}`,
            data: [],
            yAxisID: "y1",
            borderColor: colourOf(slug),
            backgroundColor: colourOf(slug),
            borderDash: [6, 3],
          },
        ]),
      },
      options: valOptions,
    });
    const bytesOptions = baseOptions("minutes since the first step", "bytes (total)");
    bytesOptions.scales.y.ticks = { callback: (value) => bytes(value) };
    bytesOptions.plugins.tooltip = {
      callbacks: { label: (item) => `${item.dataset.label}: ${bytes(item.parsed.y)}` },
    };
    bytesChart = new Chart(bytesCanvas, {
      type: "line",
      data: {
        datasets: [
          { label: "up (hospitals → server)", data: [], borderColor: COLOURS[0], backgroundColor: COLOURS[0], pointRadius: 0 },
          { label: "down (server → hospitals)", data: [], borderColor: COLOURS[1], backgroundColor: COLOURS[1], pointRadius: 0 },
        ],
      },
      options: bytesOptions,
    });
  } else {
    chartNote.textContent = "Charts are unavailable: the chart library did not load.";
  }

  function turnLabel(turn) {
    const attempt = turn.attempt > 1 ? ` (attempt ${turn.attempt})` : "";
    return `round ${turn.round + 1} · ${hospitalName(turn.hospital)}${attempt}`;
  }

  function updateCharts() {
    if (stopped || !Chart) return;
    const turnById = new Map(turns.map((t) => [t.id, t]));
    // Loss: one dataset per turn, in the order the turns first reported.
    for (const [turnId, points] of pointsByTurn) {
      let set = lossSets.get(turnId);
      const turn = turnById.get(turnId);
      if (!set) {
        const slug = turn?.hospital;
        set = {
          label: turn ? turnLabel(turn) : `turn ${turnId}`,
          data: [],
          borderColor: colourOf(slug),
          backgroundColor: colourOf(slug),
          borderDash: DASHES[(turn?.round || 0) % DASHES.length],
          pointRadius: 0,
          borderWidth: 1.5,
        };
        lossSets.set(turnId, set);
        lossChart.data.datasets.push(set);
      } else if (turn) {
        set.label = turnLabel(turn);
      }
      set.data = points.map((p) => ({ x: p.step, y: p.loss }));
    }
    lossChart.update("none");

    // Validation: the last completed attempt of each (round, hospital).
    const best = new Map();
    for (const t of turns) {
      if (t.status !== "completed" || !t.metrics) continue;
      best.set(`${t.round}:${t.hospital}`, t);
    }
    slugs.forEach((slug, i) => {
      const mine = [...best.values()].filter((t) => t.hospital === slug).sort((a, b) => a.round - b.round);
      const pick = (t, ...keys) => {
        for (const k of keys) if (typeof t.metrics[k] === "number") return t.metrics[k];
        return null;
      };
      valChart.data.datasets[2 * i].data = mine
        .map((t) => ({ x: roundName(t.round), y: pick(t, "val_accuracy", "accuracy") }))
        .filter((p) => p.y !== null);
      valChart.data.datasets[2 * i + 1].data = mine
        .map((t) => ({ x: roundName(t.round), y: pick(t, "val_loss", "loss") }))
        .filter((p) => p.y !== null);
    });
    valChart.update("none");

    // Bytes: the job's totals over time (each point carries its turn's totals so far).
    const all = [...pointsByTurn.values()].flat().sort((a, b) => Date.parse(a.time) - Date.parse(b.time));
    const latest = new Map();
    let upTotal = 0;
    let downTotal = 0;
    const up = [];
    const down = [];
    const start = all.length ? Date.parse(all[0].time) : 0;
    for (const p of all) {
      const before = latest.get(p.turn) || { up: 0, down: 0 };
      upTotal += p.bytes_up - before.up;
      downTotal += p.bytes_down - before.down;
      latest.set(p.turn, { up: p.bytes_up, down: p.bytes_down });
      const x = (Date.parse(p.time) - start) / 60000;
      up.push({ x, y: upTotal });
      down.push({ x, y: downTotal });
    }
    bytesChart.data.datasets[0].data = up;
    bytesChart.data.datasets[1].data = down;
    bytesChart.update("none");
  }

  // -- drawing -----------------------------------------------------------------------
  function drawState() {
    const state = status?.state || job.state;
    stateBadge.textContent = state;
    stateBadge.className = `badge badge-${state}`;
    stateReason.textContent = job.state_reason ? `— ${job.state_reason}` : "";
    const since = status?.state_changed_at || job.state_changed_at;
    stateSince.textContent = since ? `(since ${ago(since)})` : "";
    for (const action of ACTIONS) {
      const button = buttons.get(action.name);
      if (!button) continue;
      const allowed = action.from.includes(state);
      button.disabled = !allowed || busy;
      button.hidden = action.name === "schedule" && state !== "draft";
      button.title = allowed ? "" : `Not possible while the job is ${state}`;
    }
  }

  function drawConfig() {
    // What it trains and how: the job's description (medsplit's JobDescription, as stored).
    const d = job.description || {};
    const rows = [
      ["Model", job.model],
      ["Mode", job.mode],
      ["Cut(s)", (d.cuts || []).join(", ")],
      ["Input shape", d.input_shape?.length ? `[${d.input_shape.join(", ")}]` : "–"],
      ["Classes", d.num_classes],
      [
        "Participants, in turn order",
        el(
          "ol",
          { style: "margin:0;padding-left:1.2rem" },
          (job.participants || []).map((p) =>
            el("li", {}, el("a", { href: `#/hospitals/${p.hospital}` }, p.hospital_name || p.hospital)),
          ),
        ),
      ],
      ["Rounds", job.rounds],
      ["Batch size", d.batch_size],
      ["Local epochs", d.local_epochs],
      ["Max steps per turn", d.max_steps_per_turn ?? "no limit"],
      ["Client optimizer", optimizerText(d.client_optimizer)],
      ["Server optimizer", optimizerText(d.server_optimizer)],
      ["Codec", d.codec],
      ["Seed", d.seed],
      ["On failure", job.on_failure === "retry" ? `retry (up to ${job.max_retries} times)` : job.on_failure],
      ["Created", `${job.created_at ? new Date(job.created_at).toLocaleString() : "–"}${job.created_by ? ` by ${job.created_by}` : ""}`],
      ["Started", job.started_at ? new Date(job.started_at).toLocaleString() : "not yet"],
      ["Finished", job.finished_at ? new Date(job.finished_at).toLocaleString() : "not yet"],
    ];
    configBox.replaceChildren(
      el(
        "table",
        {},
        el(
          "tbody",
          {},
          rows.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, v))),
        ),
      ),
    );
  }

  function drawStats() {
    const state = status?.state || job.state;
    const rounds = status?.rounds ?? job.rounds;
    const round = status ? status.round : job.current_round;
    sRound.value.textContent = `${round === null || round === undefined ? "–" : round + 1} / ${rounds}`;
    sRound.sub.textContent = round === null || round === undefined ? "not started" : "";

    const turn = status?.turn;
    if (turn) {
      sTurn.value.textContent = hospitalName(turn.hospital);
      sTurn.sub.replaceChildren(
        `place ${turn.position + 1} of ${slugs.length}`,
        turn.attempt > 1 ? `, attempt ${turn.attempt}` : "",
        " · ",
        badge(turn.status),
        known(turn.steps) ? ` · ${whole.format(turn.steps)} steps` : ` · ${count(turn.samples)} samples`,
      );
    } else {
      sTurn.value.textContent = "–";
      sTurn.sub.textContent = "no turn yet";
    }

    const totals = status?.totals || { steps: 0, samples: 0, bytes_up: 0, bytes_down: 0 };
    sSteps.value.textContent = String(totals.steps); // a bare number: tests read it
    sSteps.sub.textContent = `${whole.format(totals.samples)} samples`;
    sBytes.value.textContent = `${bytes(totals.bytes_up)} / ${bytes(totals.bytes_down)}`;
    sBytes.sub.textContent = session.me?.role === "hospital_admin" ? "over your hospital's turns so far" : "over every turn so far";

    const running = state === "running";
    const currentPoints = turn ? pointsByTurn.get(turn.id) : null;
    const recent = running && turn?.status === "running" ? recentRate(currentPoints) : null;
    const rate = recent ?? averageRate(pointsByTurn);
    sRate.value.textContent = rate ? rate.toFixed(rate < 10 ? 2 : 1) : "–";
    sRate.sub.textContent = rate ? (recent ? `over the last ${RATE_WINDOW_S} s of this turn` : "average over the turns") : "not measured yet";

    // Time left: the steps still to take over the time one step takes. Known only when a
    // turn's steps are capped: completed or skipped places count as done.
    let left = "unknown";
    let leftSub = "";
    const places = slugs.length * rounds;
    if (TERMINAL.has(state)) {
      left = "–";
      leftSub = `the job is ${state}`;
    } else if (!job.description?.max_steps_per_turn || !places) {
      leftSub = "no step limit per turn, so the remaining steps are not known";
    } else {
      const done = new Set(
        turns.filter((t) => t.status === "completed" || t.status === "skipped").map((t) => `${t.round}:${t.position}`),
      );
      const inFlight = turn && turn.status === "running" && !done.has(`${round}:${turn.position}`) ? turn.steps ?? 0 : 0;
      const remaining = Math.max(0, (places - done.size) * job.description?.max_steps_per_turn - inFlight);
      if (remaining === 0) {
        left = "0 s";
      } else if (rate) {
        left = `about ${duration(remaining / rate)}`;
        leftSub = `${whole.format(remaining)} steps to go at ${rate.toFixed(2)} steps/s`;
      } else {
        leftSub = `${whole.format(remaining)} steps to go; speed not measured yet`;
      }
      if (state === "paused") leftSub = `paused · ${leftSub}`;
    }
    sLeft.value.textContent = left;
    sLeft.sub.textContent = leftSub;

    sLoss.value.textContent = status?.last_loss === null || status?.last_loss === undefined ? "–" : fixed(status.last_loss);
    sLoss.sub.textContent = turn ? `of ${hospitalName(turn.hospital)}'s turn` : "";
  }

  function drawTurns() {
    turnsBox.replaceChildren(
      table(
        [
          { label: "Round", value: (t) => t.round + 1 },
          { label: "Place", value: (t) => t.position + 1 },
          { label: "Hospital", value: (t) => el("a", { href: `#/hospitals/${t.hospital}` }, hospitalName(t.hospital)) },
          { label: "Attempt", value: (t) => t.attempt },
          { label: "Status", value: (t) => badge(t.status) },
          { label: "Steps", value: (t) => count(t.steps) },
          { label: "Samples", value: (t) => count(t.samples) },
          { label: "Bytes up / down", value: bytesOf },
          { label: "Validation", value: (t) => metricsText(t.metrics) },
          { label: "Failure reason", value: (t) => t.failure_reason || "" },
        ],
        turns,
        { empty: "No turns yet: they appear when the job starts." },
      ),
    );
  }

  // -- refresh -----------------------------------------------------------------------
  async function fetchMetrics() {
    const query = { page_size: 500 };
    if (lastPointTime) query.since = new Date(Date.parse(lastPointTime) - SINCE_OVERLAP_MS).toISOString();
    const points = (await apiAll(`jobs/${jobId}/metrics/`, query)) || [];
    let added = false;
    for (const p of points) {
      const key = `${p.turn}:${p.step}`;
      if (seen.has(key)) continue;
      seen.add(key);
      added = true;
      if (!pointsByTurn.has(p.turn)) pointsByTurn.set(p.turn, []);
      pointsByTurn.get(p.turn).push(p);
      if (!lastPointTime || Date.parse(p.time) > Date.parse(lastPointTime)) lastPointTime = p.time;
    }
    if (added) for (const list of pointsByTurn.values()) list.sort((a, b) => a.step - b.step);
  }

  async function refresh() {
    const [newStatus, newTurns] = await Promise.all([
      api(`jobs/${jobId}/status/`),
      apiAll(`jobs/${jobId}/turns/`, { page_size: 500 }),
      fetchMetrics(),
    ]);
    if (stopped) return;
    if (newStatus.state !== job.state) {
      job = await api(`jobs/${jobId}/`);
      if (stopped) return;
      drawConfig();
    }
    status = newStatus;
    turns = newTurns || [];
    drawState();
    drawStats();
    drawTurns();
    updateCharts();
    // A finished job no longer changes: one last full refresh, then stop polling.
    if (TERMINAL.has(status.state)) {
      if (finalDone) stopPoll();
      finalDone = true;
    }
  }

  async function act(action) {
    if (action.name === "cancel" && !window.confirm(`Cancel job ${job.name || job.id}? A cancelled job cannot be restarted.`)) {
      return;
    }
    busy = true;
    drawState();
    actionError.textContent = "";
    try {
      job = await api(`jobs/${jobId}/${action.name}/`, { method: "POST", body: { reason: reason.value.trim() } });
      if (status) status = { ...status, state: job.state, state_changed_at: job.state_changed_at };
      reason.value = "";
      toast(`Job ${job.id} ${action.done}.`);
    } catch (error) {
      actionError.textContent = error.message;
    } finally {
      busy = false;
    }
    drawState();
    drawConfig();
    refresh().catch((error) => console.warn(error));
    // Keep the keyboard near: on the button used, or the next one that now applies.
    const next = [buttons.get(action.name), ...buttons.values()].find((b) => b && !b.disabled && !b.hidden);
    (next || reason).focus();
  }

  drawState();
  drawStats();
  drawConfig();
  stopPoll = every(POLL_SECONDS, refresh);
  return () => {
    stopped = true;
    stopPoll();
    for (const chart of [lossChart, valChart, bytesChart]) chart?.destroy();
  };
}
