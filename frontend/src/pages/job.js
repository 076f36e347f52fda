// One job, live: its state, progress, speed and time left, charts of the training loss,
// the validation metrics and the bytes that crossed, its turns, and (for consortium
// admins) the buttons that schedule, pause, resume or cancel it.
//
// Polls every 2 s while the job can still change:
//   GET /api/jobs/<id>/status/          state, round, current turn, totals (fast)
//   GET /api/jobs/<id>/turns/           every turn with its counters and metrics
//   GET /api/jobs/<id>/metrics/?since=  only the metric points not yet seen (bytes, speed)
//   GET /api/jobs/<id>/loss-series/     one loss curve per hospital over the job's steps,
//                                       where each round starts, the steps of each turn
//   GET /api/jobs/<id>/                 again only when the state changed (its reason),
//                                       between a parallel round's turns (its secure
//                                       aggregation) and while a vertical job's parties
//                                       report their record alignment (its alignment)
//   GET /api/jobs/<id>/results/         once the job has ended, and again while its final
//                                       model's evaluation runs: each hospital's figures on
//                                       its test set (accuracy beside its majority-class
//                                       baseline, AUC; Dice) and their weighted mean
// and once GET /api/hospitals/ for the label counts (each accuracy's majority baseline)
// The job API says its task and the metric its turns report (val_accuracy, or val_dice
// for segmentation, shown as Dice without the majority baseline). A vertical job's
// label-leakage audit comes with GET /api/jobs/<id>/ (label_leakage), read again when a
// round ends. A job with a privacy audit or activation noise also polls
//   GET /api/jobs/<id>/privacy/         each hospital's figures per round (its own only,
//                                       for a hospital admin), until the last round's came
// Actions: POST /api/jobs/<id>/schedule|pause|resume|cancel/ {reason}.
// Links: the job's result document, /jobs/<id>/document/ and its download (platform/reports/).

import { hijackAlerts } from "./hijack-alerts.js";
import { api, apiAll, CoordinatorUnreachable } from "../api.js";
import { every, isConsortiumAdmin } from "../app.js";
import { ago, badge, bytes, duration, el, swap, table, toast } from "../ui.js";
import { measuresPrivacy, privacyPanel } from "./privacy-panel.js";

const POLL_SECONDS = 2;
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
// Which states each action may leave from (platform/training/states.py TRANSITIONS).
const ACTIONS = [
  { name: "schedule", label: "Schedule", from: ["draft"], done: "scheduled" },
  { name: "pause", label: "Pause", from: ["running"], done: "paused" },
  { name: "resume", label: "Resume", from: ["paused"], done: "resumed" },
  { name: "cancel", label: "Cancel job", from: ["draft", "scheduled", "running", "paused"], done: "cancelled" },
];
// Ten colours told apart at a glance (a job of ten hospitals has one each).
const COLOURS = [
  "#1f5fbf", "#c2410c", "#15803d", "#7c3aed", "#b91c1c",
  "#0e7490", "#a16207", "#be185d", "#4d7c0f", "#334155",
];
// Overlap of incremental metric fetches: a point can be stored with a time slightly
// before another that was already read; the overlap (and de-duplication) catches it.
const SINCE_OVERLAP_MS = 10_000;
// Steps per second, one definition everywhere on the page: the job's training steps in
// the last RATE_WINDOW_S seconds of its progress (every turn shown, the gaps between
// turns included), per second.
const RATE_WINDOW_S = 60;
const RATE_TEXT = `training steps per second over the last ${RATE_WINDOW_S} s of progress, gaps between turns included`;

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
  const entries = Object.entries(rest).sort(([a], [b]) => a.localeCompare(b));
  return `${name} (${entries.map(([k, v]) => `${k} ${Array.isArray(v) ? v.join("/") : v}`).join(", ")})`;
}

/** A job's augmentation (its description's list of transforms) in words. */
function augmentationText(list) {
  if (!list?.length) return "none";
  return list
    .map(({ name, ...params }) => {
      // By name: a stored JSON object's keys come back in the database's order.
      const args = Object.entries(params)
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([k, v]) => `${k} ${Array.isArray(v) ? v.join("/") : v}`);
      return args.length ? `${name} (${args.join(", ")})` : name;
    })
    .join(", then ");
}

const num = (v, digits = 3) => (Number.isInteger(v) ? String(v) : Number(v).toFixed(digits));

/** The majority class's share of a hospital's labels (its heartbeat's label counts): the
 * accuracy of always answering that class. The validation split is stratified by label,
 * so it holds (nearly) the same share. Null where the counts are not known. */
export function majorityShare(summary) {
  const counts = Object.values(summary?.label_counts || {}).filter((n) => typeof n === "number");
  const total = counts.reduce((a, b) => a + b, 0);
  return total > 0 ? Math.max(...counts) / total : null;
}

/** An accuracy with its majority-class baseline beside it. */
function accuracyText(accuracy, baseline) {
  const shown = el("span", {}, `accuracy ${num(accuracy)}`);
  const beside =
    baseline === null || baseline === undefined
      ? el("span", { class: "baseline", title: "the hospital's label counts are not known here" }, " (majority baseline not known)")
      : el(
          "span",
          { class: "baseline", title: "the accuracy of always answering the hospital's most frequent label" },
          ` (majority class ${num(baseline)})`,
        );
  return el("span", {}, shown, beside);
}

/** How a metric is named on the page (the job API's ``metric`` is val_<metric>). */
const METRIC_LABELS = { accuracy: "accuracy", dice: "Dice" };
// The metric of a task where the job API does not say it (a coordinator older than tasks).
const TASK_METRICS = { classification: "accuracy", segmentation: "dice" };
export const metricLabel = (metric) => METRIC_LABELS[metric] || metric.replace(/_/g, " ");

/** The validation metrics of a turn: the task's metric (accuracy with its majority
 * baseline; Dice), loss, AUC, samples. */
function validationCell(metrics, baseline, metric = "accuracy") {
  const m = metrics || {};
  const parts = [];
  const key = `val_${metric}`;
  if (typeof m[key] === "number") {
    parts.push(
      metric === "accuracy"
        ? accuracyText(m[key], baseline)
        : el("span", { "data-testid": `val-${metric}` }, `${metricLabel(metric)} ${num(m[key])}`),
    );
  }
  if (typeof m.val_loss === "number") parts.push(`loss ${num(m.val_loss, 4)}`);
  if (typeof m.val_auc === "number") parts.push(`AUC ${num(m.val_auc)}`);
  if (typeof m.val_samples === "number") parts.push(`${whole.format(m.val_samples)} samples`);
  const known = new Set([key, "val_loss", "val_auc", "val_samples", "train_loss"]);
  for (const [k, v] of Object.entries(m)) if (!known.has(k)) parts.push(`${k.replace(/_/g, " ")} ${num(v, 4)}`);
  if (!parts.length) return "–";
  return el(
    "span",
    { "data-testid": "validation-cell" },
    "val ",
    parts.flatMap((part, i) => (i ? [" · ", part] : [part])),
  );
}

/** An attack's AUC in words: how far from chance (0.5) it is, either way (an AUC of 0
 * recovers every label too, by answering the other way round). */
function leakageText(auc) {
  if (auc === null || auc === undefined) return el("span", { class: "muted", title: "the labels are not binary" }, "–");
  const strength = Math.abs(auc - 0.5) * 2; // 0: chance, 1: every label
  const words =
    strength < 0.1 ? "about chance" : strength >= 0.9 ? "labels recovered" : strength >= 0.5 ? "much leaks" : "some leaks";
  const kind = strength < 0.1 ? "ok" : strength >= 0.5 ? "failed" : "pending";
  return el("span", {}, num(auc), " ", badge(words, kind));
}

/** The job's steps over time from its stored points: each point carries its turn's totals
 * so far, so the job's total grows by what its turn gained since that turn's last point. */
function totalsOverTime(pointsByTurn) {
  const all = [...pointsByTurn.values()].flat().sort((a, b) => Date.parse(a.time) - Date.parse(b.time));
  const latest = new Map();
  const total = { steps: 0, up: 0, down: 0 };
  return all.map((p) => {
    const before = latest.get(p.turn) || { steps: 0, up: 0, down: 0 };
    total.steps += p.step - before.steps;
    total.up += p.bytes_up - before.up;
    total.down += p.bytes_down - before.down;
    latest.set(p.turn, { steps: p.step, up: p.bytes_up, down: p.bytes_down });
    return { time: Date.parse(p.time), ...total };
  });
}

// Time left waits for this much progress: a turn's first steps are slow (the hand-off,
// warm-up), and a rate over a few seconds of them overstates the time left several-fold.
const ESTIMATE_AFTER_S = 10;

/** Seconds of progress the rate is measured over (at most RATE_WINDOW_S). */
function rateSpan(totals) {
  if (totals.length < 2) return 0;
  const last = totals[totals.length - 1].time;
  const first = totals.find((t) => last - t.time <= RATE_WINDOW_S * 1000) || totals[0];
  return Math.max(0, (last - first.time) / 1000);
}

/** RATE_TEXT: steps in the last RATE_WINDOW_S s of progress, per second (null: too few). */
function stepRate(totals) {
  if (totals.length < 2) return null;
  const last = totals[totals.length - 1];
  let first = totals[0];
  for (let i = totals.length - 2; i >= 0; i -= 1) {
    first = totals[i];
    if (last.time - totals[i].time >= RATE_WINDOW_S * 1000) break;
  }
  const seconds = (last.time - first.time) / 1000;
  return seconds > 0 && last.steps > first.steps ? (last.steps - first.steps) / seconds : null;
}

const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });

/** Vertical lines where each round starts on the loss chart, labelled "round N". */
const roundLines = {
  id: "roundLines",
  afterDatasetsDraw(chart, _args, options) {
    const starts = options?.starts || [];
    const { ctx, chartArea, scales } = chart;
    if (!starts.length || !scales.x) return;
    ctx.save();
    ctx.strokeStyle = "#8a8f98";
    ctx.fillStyle = "#555";
    ctx.setLineDash([4, 4]);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "left";
    let free = -Infinity; // where the last label ended: a label that would touch it is left out
    for (const start of starts) {
      const x = scales.x.getPixelForValue(start.start);
      if (x < chartArea.left - 1 || x > chartArea.right + 1) continue;
      ctx.beginPath();
      ctx.moveTo(x, chartArea.top);
      ctx.lineTo(x, chartArea.bottom);
      ctx.stroke();
      const text = free === -Infinity ? `round ${start.round + 1}` : String(start.round + 1);
      const width = ctx.measureText(text).width;
      if (x + 3 >= free && x + 3 + width <= chartArea.right) {
        ctx.fillText(text, x + 3, chartArea.top + 11);
        free = x + 3 + width + 6;
      }
    }
    ctx.restore();
  },
};

/** A round's name on the validation chart (indices count from 0, people from 1). */
const roundName = (index) => `round ${index + 1}`;

function canvas(testid, label) {
  return el("canvas", { "data-testid": testid, role: "img", "aria-label": label });
}

export async function render(root, [id], session) {
  const jobId = Number(id);
  let job = await api(`jobs/${jobId}/`); // a 404 becomes the router's "Not found"
  // What it learns and what its turns report besides val_loss (the job API's task and
  // metric; a coordinator from before tasks says neither: it classifies).
  const task = job.task || job.description?.task || "classification";
  const metric = (job.metric || `val_${TASK_METRICS[task] || "accuracy"}`).replace(/^val_/, "");
  const metricName = metricLabel(metric);
  const classifies = metric === "accuracy"; // the majority-class baseline is accuracy's
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

  // The job's result document (platform/reports/): a page of the coordinator, and the
  // same document as one self-contained HTML file to keep.
  const documentLinks = el(
    "p",
    { class: "job-document", "data-testid": "job-document-links" },
    el("a", { href: `/jobs/${jobId}/document/`, "data-testid": "job-document" }, "Result document"),
    " · ",
    el(
      "a",
      { href: `/jobs/${jobId}/document/download/`, download: "", "data-testid": "job-document-download" },
      "download it (one HTML file, charts included)",
    ),
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

  const lossCanvas = canvas("loss-chart", "Training loss, one curve per hospital over the job's steps, rounds marked");
  const valCanvas = canvas("validation-chart", `Validation ${metricName} and loss per hospital, by round`);
  const bytesCanvas = canvas("bytes-chart", "Bytes sent up and down, by time of day");
  const chartNote = el("p", { class: "muted" });
  const lossNote = el("p", { class: "muted chart-note", "data-testid": "loss-note" });
  const valNote = el(
    "p",
    { class: "muted chart-note" },
    classifies
      ? "Solid: validation accuracy · dotted: the hospital's majority-class share (the accuracy of always answering its most frequent label) · dashed: validation loss (right axis)."
      : `Solid: validation ${metricName} (${task}) · dashed: validation loss (right axis).`,
  );
  const updated = el("p", { class: "muted", "data-testid": "job-updated", role: "status" });
  // The final model evaluated at every hospital on its own test set (GET results/).
  const resultsBox = el("div", { "data-testid": "results" }, el("p", { class: "muted" }, "Loading…"));
  // A consortium admin may evaluate the final model again (POST evaluate/): after a
  // hospital adds or fixes its test set, say.
  const evaluateButton = el("button", { type: "button", class: "secondary", "data-testid": "evaluate-again", hidden: true }, "Evaluate again");
  const evaluateError = el("p", { class: "error", role: "alert", "data-testid": "evaluate-error" });
  evaluateButton.addEventListener("click", () => evaluateAgain());
  const resultsCard = el(
    "div",
    { class: "card job-results" },
    el("h2", {}, "Final metrics (each hospital's test set)"),
    resultsBox,
    evaluateButton,
    evaluateError,
  );
  const charts = el(
    "section",
    { "aria-label": "Charts" },
    chartNote,
    el(
      "div",
      { class: "grid job-charts" },
      el("div", { class: "card" }, el("h2", {}, "Training loss"), el("div", { class: "chart-box" }, lossCanvas), lossNote),
      el(
        "div",
        { class: "card" },
        el("h2", { "data-testid": "validation-heading" }, `Validation ${metricName} and loss`),
        el("div", { class: "chart-box" }, valCanvas),
        valNote,
      ),
      el("div", { class: "card" }, el("h2", {}, "Bytes up and down"), el("div", { class: "chart-box" }, bytesCanvas)),
      resultsCard,
    ),
  );

  const turnsBox = el("div", { class: "job-turns" }, el("p", { class: "muted" }, "Loading…"));
  const configBox = el("div", { class: "job-config" });
  // Only a mode that aggregates securely (SplitFed) has aggregations: shown when there are.
  const aggregationHeading = el("h2", { hidden: true }, "Secure aggregation");
  const aggregationBox = el("div", { class: "job-aggregations", "data-testid": "aggregations" });
  // Only a job whose parties align their records (vertical) has an alignment.
  const alignmentHeading = el("h2", { hidden: true }, "Record alignment");
  const alignmentBox = el("div", { class: "job-alignment", "data-testid": "alignment", role: "status" });
  // Only a job with passive parties (vertical) has a label-leakage audit.
  const leakageHeading = el("h2", { hidden: true }, "Label leakage");
  const leakageBox = el("div", { class: "job-leakage", "data-testid": "leakage" });
  // A hospital that found the server hijacking its training says so above everything.
  const hijackBox = el("div", { "data-testid": "hijack-alerts" });
  // Only a job whose hospitals audit their exposure or noise their activations.
  const privacy = privacyPanel(hospitalName, (slug, name) => el("a", { href: `#/hospitals/${slug}` }, name));
  let privacyRows = [];

  root.append(
    el("p", {}, el("a", { href: "#/jobs" }, "← Jobs")),
    title,
    head,
    documentLinks,
    hijackBox,
    updated,
    controls || "", // append(null) would show "null"
    stats,
    // A vertical job's alignment comes before its first step: shown above what follows it.
    alignmentHeading,
    alignmentBox,
    el("h2", {}, "Charts"),
    charts,
    el("h2", {}, "Turns"),
    turnsBox,
    leakageHeading,
    leakageBox,
    privacy.heading,
    privacy.box,
    aggregationHeading,
    aggregationBox,
    el("h2", {}, "Configuration"),
    configBox,
  );

  // -- state -------------------------------------------------------------------------
  let status = null;
  let turns = [];
  let series = null; // GET loss-series/
  let results = null; // GET results/ (once the job has ended)
  const baselines = new Map(); // slug -> majority share, where the label counts are known
  let baselinesLoaded = false;
  let updatedAt = null;
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
  const slugs = (job.participants || []).map((p) => p.hospital);
  const colourOf = (slug) => COLOURS[Math.max(0, slugs.indexOf(slug)) % COLOURS.length];

  // One legend entry per hospital (clicking it hides or shows all of that hospital's
  // lines): ten hospitals fit; a line's kind is told by its style, said under the chart.
  const hospitalLegend = {
    position: "bottom",
    labels: {
      boxWidth: 12,
      generateLabels: (chart) =>
        slugs.map((slug) => ({
          text: hospitalName(slug),
          fillStyle: colourOf(slug),
          strokeStyle: colourOf(slug),
          hidden: chart.data.datasets.every((d, i) => d.hospital !== slug || !chart.isDatasetVisible(i)),
          hospital: slug,
        })),
    },
    onClick: (_event, item, legend) => {
      const chart = legend.chart;
      chart.data.datasets.forEach((d, i) => {
        if (d.hospital === item.hospital) chart.setDatasetVisibility(i, item.hidden);
      });
      chart.update("none");
    },
  };

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
    const lossOptions = baseOptions("step of the job (the hospitals' turns one after another)", "training loss");
    lossOptions.plugins.legend = hospitalLegend;
    lossOptions.plugins.roundLines = { starts: [] };
    lossOptions.plugins.tooltip = {
      callbacks: {
        title: (items) => (items.length ? `step ${items[0].parsed.x}` : ""),
        label: (item) => `${item.dataset.label}: ${fixed(item.parsed.y)}`,
      },
    };
    lossChart = new Chart(lossCanvas, {
      type: "line",
      data: {
        datasets: slugs.map((slug) => ({
          label: hospitalName(slug),
          hospital: slug,
          data: [],
          borderColor: colourOf(slug),
          backgroundColor: colourOf(slug),
          pointRadius: 0,
          borderWidth: 1.5,
          // From one of its turns to its next the line runs over the others' turns: dotted.
          segment: { borderDash: (ctx) => (betweenTurns(ctx.p0.parsed.x, ctx.p1.parsed.x) ? [2, 4] : undefined) },
        })),
      },
      options: lossOptions,
      plugins: [roundLines],
    });
    const valOptions = baseOptions("round", metricName);
    valOptions.scales.x = { type: "category", title: { display: true, text: "round" } };
    valOptions.scales.y.min = 0;
    valOptions.scales.y.max = 1;
    valOptions.scales.y1 = {
      position: "right",
      title: { display: true, text: "loss" },
      grid: { drawOnChartArea: false },
    };
    valOptions.plugins.legend = hospitalLegend;
    valChart = new Chart(valCanvas, {
      type: "line",
      data: {
        labels: Array.from({ length: job.rounds }, (_, i) => roundName(i)),
        datasets: slugs.flatMap((slug) => [
          {
            label: `${metricName} · ${hospitalName(slug)}`,
            hospital: slug,
            data: [],
            yAxisID: "y",
            borderColor: colourOf(slug),
            backgroundColor: colourOf(slug),
          },
          {
            label: `majority-class share · ${hospitalName(slug)}`,
            hospital: slug,
            data: [],
            yAxisID: "y",
            borderColor: colourOf(slug),
            backgroundColor: colourOf(slug),
            borderDash: [2, 3],
            borderWidth: 1,
            pointRadius: 0,
          },
          {
            label: `loss · ${hospitalName(slug)}`,
            hospital: slug,
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
    const bytesOptions = baseOptions("time of day", "bytes (total)");
    bytesOptions.scales.x.ticks = { callback: (value) => clock(value), maxTicksLimit: 8 };
    bytesOptions.scales.y.ticks = { callback: (value) => bytes(value) };
    bytesOptions.plugins.tooltip = {
      callbacks: {
        title: (items) => (items.length ? clock(items[0].parsed.x) : ""),
        label: (item) => `${item.dataset.label}: ${bytes(item.parsed.y)}`,
      },
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

  // A hospital takes one turn a round: two of its points with a round's start between
  // them belong to two of its turns (a turn's last step may sit on the next round's start;
  // the next turn's first step lies after it).
  function betweenTurns(x0, x1) {
    return (series?.rounds || []).some((r) => x0 <= r.start && r.start < x1);
  }

  function updateCharts() {
    if (stopped || !Chart) return;
    // Loss: one curve per hospital over the job's steps (GET loss-series/).
    const curves = new Map((series?.series || []).map((c) => [c.hospital, c.points]));
    for (const set of lossChart.data.datasets) {
      set.data = (curves.get(set.hospital) || []).map(([x, y]) => ({ x, y }));
    }
    lossChart.options.plugins.roundLines.starts = series?.rounds || [];
    lossChart.options.scales.x.min = 0;
    lossChart.options.scales.x.suggestedMax = series?.total_steps || undefined;
    lossChart.update("none");
    const anyLoss = [...curves.values()].some((points) => points.length);
    const from =
      series?.loss_from === "hospital"
        ? "Each hospital computes its own loss in this mode; its agent reports it (one number, about once a second)."
        : "The loss as the server computes it at each step.";
    lossNote.textContent = anyLoss
      ? `${from} Dashed grey lines: where each round starts, numbered; dotted: a hospital's curve from one of its turns to its next.`
      : series?.loss_from === "hospital"
        ? `${from} None reported yet (an agent may be set not to: report_loss = false).`
        : "No loss yet: it appears with the first steps.";

    // Validation: the last completed attempt of each (round, hospital).
    const best = new Map();
    for (const t of turns) {
      if (t.status !== "completed" || !t.metrics) continue;
      best.set(`${t.round}:${t.hospital}`, t);
    }
    slugs.forEach((slug, i) => {
      const mine = [...best.values()].filter((t) => t.hospital === slug).sort((a, b) => a.round - b.round);
      const pick = (t, key) => (typeof t.metrics[key] === "number" ? t.metrics[key] : null);
      valChart.data.datasets[3 * i].data = mine
        .map((t) => ({ x: roundName(t.round), y: pick(t, `val_${metric}`) }))
        .filter((p) => p.y !== null);
      const baseline = baselines.get(slug);
      valChart.data.datasets[3 * i + 1].data =
        !classifies || baseline === undefined || baseline === null
          ? []
          : Array.from({ length: job.rounds }, (_, r) => ({ x: roundName(r), y: baseline }));
      valChart.data.datasets[3 * i + 2].data = mine
        .map((t) => ({ x: roundName(t.round), y: pick(t, "val_loss") }))
        .filter((p) => p.y !== null);
    });
    valChart.update("none");

    // Bytes: the job's totals by time of day.
    const totals = totalsOverTime(pointsByTurn);
    bytesChart.data.datasets[0].data = totals.map((p) => ({ x: p.time, y: p.up }));
    bytesChart.data.datasets[1].data = totals.map((p) => ({ x: p.time, y: p.down }));
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
      // A MODULE:FACTORY model's keyword arguments (a registry model has none).
      ...(Object.keys(d.model_args || {}).length ? [["Model arguments", JSON.stringify(d.model_args)]] : []),
      ["Mode", job.mode],
      // A vertical party's own front (party_models), beside the job's model.
      ...Object.entries(d.party_models || {}).map(([slug, m]) => [
        `${hospitalName(slug)}'s model`,
        `${m.model}${Object.keys(m.model_args || {}).length ? ` ${JSON.stringify(m.model_args)}` : ""}, cut after ${m.cut}, input [${(m.input_shape || []).join(", ")}]`,
      ]),
      ["Task", `${task}${d.loss ? `, loss ${d.loss}` : ""} (validation ${metricName})`],
      ["Augmentation", augmentationText(d.augmentation)],
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
      ...(Object.keys(d.mode_options || {}).length
        ? [["Mode options", Object.entries(d.mode_options).map(([k, v]) => `${k} ${v}`).join(", ")]]
        : []),
      ["Round deadline", `${job.round_deadline_seconds} s (parallel rounds)`],
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

    const progress = totalsOverTime(pointsByTurn);
    const rate = stepRate(progress);
    const measured = rateSpan(progress);
    sRate.value.textContent = rate ? rate.toFixed(rate < 10 ? 2 : 1) : "–";
    sRate.sub.textContent = rate ? RATE_TEXT : `not measured yet (${RATE_TEXT})`;

    // Time left: the steps still to take over the rate above. A turn takes the steps its
    // hospital's training split gives (batch size, local epochs, drop_last, step limit);
    // completed or skipped places count as done, a running one by the steps it took.
    let left = "unknown";
    let leftSub = "";
    const places = slugs.length * rounds;
    const perTurn = series?.turn_steps || {};
    const unknown = slugs.filter((slug) => typeof perTurn[slug] !== "number");
    if (TERMINAL.has(state)) {
      left = "–";
      leftSub = `the job is ${state}`;
    } else if (!places) {
      leftSub = "no participants";
    } else if (unknown.length && session.me?.role === "hospital_admin") {
      leftSub = "the other hospitals' split sizes are not shown to you, so the steps to go are not known";
    } else if (unknown.length) {
      leftSub = `${unknown.map(hospitalName).join(", ")} reported no split sizes yet, so the steps to go are not known`;
    } else {
      const byPlace = new Map();
      for (const t of turns) byPlace.set(`${t.round}:${t.position}`, t); // the latest attempt
      let remaining = 0;
      for (let r = 0; r < rounds; r += 1) {
        slugs.forEach((slug, position) => {
          const t = byPlace.get(`${r}:${position}`);
          if (t && (t.status === "completed" || t.status === "skipped")) return;
          const done = t && t.status === "running" && known(t.steps) ? t.steps : 0;
          remaining += Math.max(0, perTurn[slug] - done);
        });
      }
      if (remaining === 0) {
        left = "0 s";
      } else if (rate && measured < ESTIMATE_AFTER_S) {
        left = "estimating…";
        leftSub = `${whole.format(remaining)} steps to go; the speed is measured over ${Math.round(measured)} s so far (an estimate after ${ESTIMATE_AFTER_S} s)`;
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
    const whose = series?.loss_from === "hospital" ? " (as the hospital reported it)" : "";
    sLoss.sub.textContent = turn ? `of ${hospitalName(turn.hospital)}'s turn${whose}` : "";
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
          {
            label: "Train loss (mean over the turn)",
            value: (t) => (typeof t.metrics?.train_loss === "number" ? fixed(t.metrics.train_loss) : "–"),
          },
          { label: "Validation", value: (t) => validationCell(t.metrics, baselines.get(t.hospital), metric) },
          { label: "Failure reason", value: (t) => t.failure_reason || "" },
        ],
        turns,
        { empty: "No turns yet: they appear when the job starts." },
      ),
    );
  }

  // The alignment's status in words (GET /api/jobs/{id}/'s alignment, training/alignment.py).
  const ALIGNMENT_WORDS = {
    pending: "waiting for every party to report the intersection it holds",
    agreed: "agreed: every party holds the same intersection",
    mismatch: "failed: the parties hold different intersections",
    too_small: "failed: the intersection is smaller than the job's minimum",
    failed: "failed: the job ended before the parties agreed",
  };
  const ALIGNMENT_BADGES = { pending: "pending", agreed: "ok", mismatch: "failed", too_small: "failed", failed: "failed" };

  /** Whether the job aligns records (the coordinator serves an alignment for every job
   * whose mode does, pending before any party reported). */
  const aligns = () => Boolean(job.alignment);

  function drawAlignment() {
    alignmentHeading.hidden = !aligns();
    if (!aligns()) return alignmentBox.replaceChildren();
    // Before any party reported, the API has no alignment yet: nobody reported.
    const a = job.alignment || {
      status: TERMINAL.has(job.state) ? "failed" : "pending",
      size: null,
      reported: 0,
      parties: (job.participants || []).length,
      minimum: job.description?.mode_options?.min_records ?? null,
      reason: TERMINAL.has(job.state) ? job.state_reason : "",
    };
    const size = a.size === null || a.size === undefined ? "not known yet" : `${count(a.size)} records`;
    const minimum = a.minimum === null || a.minimum === undefined ? "the job's min_records" : `${count(a.minimum)} records`;
    const rows = [
      ["Status", el("span", {}, badge(a.status, ALIGNMENT_BADGES[a.status]), " ", ALIGNMENT_WORDS[a.status] || a.status)],
      ["Intersection", `${size} (the job needs at least ${minimum})`],
      ["Parties reported", `${a.reported} of ${a.parties}`],
      ...(a.reason ? [["Why", a.reason]] : []),
    ];
    swap(
      alignmentBox,
      el(
        "p",
        { class: "muted" },
        "Before the first step the parties find the patients they all hold by private set intersection; the coordinator compares their digests and sizes, never an identifier.",
      ),
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

  // The label party's audit of what the gradients it sends back tell a passive party about
  // its labels (platform/training/leakage.py): kept for every job whose parties hold
  // different features, the jobs that align their records.
  function drawHijack() {
    hijackBox.replaceChildren(...hijackAlerts(job.hijack_alerts, "job", hospitalName));
  }

  function drawLeakage() {
    const rows = [...(job.label_leakage || [])].sort((a, b) => a.round - b.round || a.hospital.localeCompare(b.hospital));
    const shown = rows.length > 0 || aligns();
    leakageHeading.hidden = !shown;
    if (!shown) return leakageBox.replaceChildren();
    swap(
      leakageBox,
      el(
        "p",
        { class: "muted", "data-testid": "leakage-meaning" },
        "After each round the label party measures how well two known attacks recover its labels from the gradients it sends a passive party " +
          "(the norm and the direction, cosine, of each record's gradient), as ROC AUC: 0.5 = nothing leaks (chance), 1.0 = the labels are fully recovered " +
          "(0.0 too, read the other way round). Only these numbers reach the coordinator.",
      ),
      table(
        [
          { label: "Round", value: (r) => r.round + 1 },
          { label: "Passive party", value: (r) => el("a", { href: `#/hospitals/${r.hospital}` }, hospitalName(r.hospital)) },
          { label: "Records scored", value: (r) => count(r.records) },
          { label: "Norm attack AUC", value: (r) => leakageText(r.norm_auc) },
          { label: "Cosine attack AUC", value: (r) => leakageText(r.cosine_auc) },
        ],
        rows,
        { empty: "No audit yet: the label party reports one after each round." },
      ),
    );
  }

  // The final figures (platform/training/selectors.py job_results): of another hospital a
  // hospital admin gets its name and its evaluation's status only, and the weighted means.
  const RESULT_STATUS = { no_test_set: "no test set" };
  function drawResults() {
    evaluateButton.hidden = !(admin && job.state === "completed" && results?.evaluable);
    evaluateButton.disabled = busy || results?.evaluation?.status === "running";
    if (!results) {
      resultsBox.replaceChildren(
        el("p", { class: "muted" }, TERMINAL.has(status?.state || job.state) ? "Loading…" : "Once the job completes, its final model is evaluated at every hospital that holds a test set."),
      );
      return;
    }
    if (!results.evaluable) return resultsBox.replaceChildren(el("p", { class: "muted", "data-testid": "results-refusal" }, `Not evaluated: ${results.refusal}`));
    if (!results.evaluation) {
      return resultsBox.replaceChildren(
        el("p", { class: "muted" }, job.state === "completed" ? "No evaluation yet." : `No evaluation: the job is ${job.state}, and only a completed job's final model is evaluated.`),
      );
    }
    const segmentation = results.task === "segmentation";
    const shown = (h) => typeof h.test_samples === "number"; // yours, or everyone's
    // Another hospital's figures are not in the answer (a hospital admin's); a hospital
    // without figures (no test set, failed, running) shows a dash.
    const figure = (h, draw) => {
      if (!shown(h)) return el("span", { class: "muted" }, "not shown to you");
      if (h.status !== "completed") return "–";
      // A vertical job's passive party: its front took part, the figures are the label party's.
      const scored = typeof (segmentation ? h.dice : h.accuracy) === "number";
      return scored ? draw(h) : el("span", { class: "muted", title: "a vertical job's figures are the label party's" }, "joint");
    };
    const columns = [
      { label: "Hospital", value: (h) => h.name || hospitalName(h.hospital) },
      { label: "Status", value: (h) => badge(RESULT_STATUS[h.status] || h.status, h.status === "no_test_set" ? "draft" : h.status) },
      { label: "Test samples", value: (h) => (shown(h) ? count(h.test_samples) : "–") },
      segmentation
        ? { label: "Mean Dice", value: (h) => figure(h, (x) => el("span", { "data-testid": "result-dice" }, num(x.dice))) }
        : {
            label: "Accuracy",
            value: (h) => figure(h, (x) => el("span", { "data-testid": "result-accuracy" }, accuracyText(x.accuracy, x.baseline_accuracy))),
          },
      ...(segmentation
        ? []
        : [{ label: "ROC AUC", value: (h) => figure(h, (x) => (typeof x.auc === "number" ? num(x.auc) : el("span", { class: "muted", title: "the test set lacks a class" }, "–"))) }]),
    ];
    const mean = results.weighted_mean;
    const e = results.evaluation;
    resultsBox.replaceChildren(
      el(
        "p",
        { class: "muted" },
        `Evaluation ${e.attempt}, ${e.status}${e.requested_by ? `, asked for by ${e.requested_by}` : ""}: through the split, figures only.`,
      ),
      table(columns, results.hospitals || [], { empty: "No hospital takes part." }),
      mean
        ? el(
            "p",
            { "data-testid": "results-weighted-mean" },
            el("strong", {}, `${mean.label[0].toUpperCase()}${mean.label.slice(1)}`),
            ` (${mean.hospitals} hospital${mean.hospitals === 1 ? "" : "s"}): `,
            segmentation
              ? `Dice ${num(mean.dice)}`
              : el("span", {}, accuracyText(mean.accuracy, mean.baseline_accuracy), typeof mean.auc === "number" ? ` · AUC ${num(mean.auc)}` : ""),
          )
        : el("p", { class: "muted" }, "No hospital's figures yet."),
    );
  }

  function drawAggregations() {
    const rows = job.aggregations || [];
    aggregationHeading.hidden = rows.length === 0;
    if (!rows.length) return aggregationBox.replaceChildren();
    const who = (names) => names.map(hospitalName).join(", ");
    aggregationBox.replaceChildren(
      el(
        "p",
        { class: "muted" },
        "Each round the hospitals mask their segments; a worker sums the masked vectors and each hospital unmasks the average. Nobody but the hospitals sees a segment, single or averaged: below are sizes and digests only.",
      ),
      table(
        [
          { label: "Round", value: (a) => a.round + 1 },
          { label: "Attempt", value: (a) => a.attempt + 1 },
          { label: "Status", value: (a) => badge(a.status) },
          {
            label: "Hospitals (training samples)",
            value: (a) => Object.entries(a.weights).map(([h, n]) => `${hospitalName(h)} (${count(n)})`).join(", "),
          },
          {
            label: "Submitted",
            value: (a) => `${Object.keys(a.submitted).length} of ${Object.keys(a.weights).length}`,
          },
          {
            label: "Aggregate",
            value: (a) => (a.aggregate_sha256 ? `${bytes(a.aggregate_size_bytes)}, sha256 ${a.aggregate_sha256.slice(0, 12)}…` : "–"),
          },
          {
            label: "Left out",
            value: (a) => (a.dropped.length ? `${who(a.dropped.map((d) => d.hospital))}: ${a.dropped[0].reason}` : ""),
          },
          { label: "Why it ended", value: (a) => (a.status === "done" ? "" : a.failure_reason || "") },
        ],
        rows,
        {},
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

  async function loadBaselines() {
    // A hospital admin sees their own hospital only: the others' turns show no metrics.
    const hospitals =
      (await apiAll("hospitals/").catch((error) => {
        if (error instanceof CoordinatorUnreachable) throw error;
        return []; // not theirs to read: the accuracies say the baseline is not known
      })) || [];
    baselinesLoaded = true;
    for (const h of hospitals) {
      const share = majorityShare(h.dataset_summary);
      if (share !== null) baselines.set(h.slug, share);
    }
  }

  function drawUpdated(error) {
    if (!error) {
      updatedAt = new Date();
      updated.className = "muted";
      updated.textContent = TERMINAL.has(status?.state)
        ? `The job is ${status.state}: this page no longer changes.`
        : `Updated ${clock(updatedAt)}; refreshes every ${POLL_SECONDS} s.`;
      return;
    }
    updated.className = "stale";
    const since = updatedAt ? `since ${clock(updatedAt)}` : "yet";
    updated.textContent =
      error instanceof CoordinatorUnreachable
        ? `Frozen: not updated ${since}. The coordinator is not answering; retrying every ${POLL_SECONDS} s.`
        : `Not updated ${since}: ${error.message}; retrying every ${POLL_SECONDS} s.`;
  }

  async function refresh() {
    try {
      await refreshOnce();
    } catch (error) {
      if (!stopped) drawUpdated(error);
      throw error;
    }
    if (!stopped) drawUpdated(null);
  }

  async function refreshOnce() {
    const [newStatus, newTurns, newSeries, newPrivacy] = await Promise.all([
      api(`jobs/${jobId}/status/`),
      apiAll(`jobs/${jobId}/turns/`, { page_size: 500 }),
      api(`jobs/${jobId}/loss-series/`),
      measuresPrivacy(job) ? api(`jobs/${jobId}/privacy/`) : null,
      fetchMetrics(),
      baselinesLoaded ? null : loadBaselines(),
    ]);
    if (stopped) return;
    series = newSeries;
    // A job with secure aggregation rounds changes between turns too (an aggregation opens
    // once a round's turns ended): read it again then, not on every refresh.
    const betweenTurns = newStatus.state === "running" && !(newTurns || []).some((t) => t.status === "running");
    // So does an alignment while its parties report.
    const aligning = aligns() && !TERMINAL.has(newStatus.state) && (job.alignment?.status || "pending") === "pending";
    // And a label-leakage audit while rounds have ended that it has not reported on yet
    // (the label party reports each round's once that round's turns completed).
    const roundsDone = new Set((newTurns || []).filter((t) => t.status === "completed").map((t) => t.round)).size;
    const passive = Math.max(0, (job.participants || []).length - 1);
    const auditing = aligns() && (job.label_leakage || []).length < roundsDone * passive;
    if (newStatus.state !== job.state || job.aggregations?.length || betweenTurns || aligning || auditing) {
      const changed = newStatus.state !== job.state;
      job = await api(`jobs/${jobId}/`);
      if (stopped) return;
      if (changed) drawConfig();
    }
    // The results exist once the job has ended; read again while its evaluation runs.
    if (TERMINAL.has(newStatus.state) && (!results || results.evaluation?.status === "running" || (newStatus.state === "completed" && !results.evaluation))) {
      results = await api(`jobs/${jobId}/results/`);
      if (stopped) return;
    }
    drawAggregations();
    drawAlignment();
    drawLeakage();
    drawHijack();
    if (newPrivacy) privacyRows = newPrivacy;
    privacy.draw(job, privacyRows);
    status = newStatus;
    turns = newTurns || [];
    drawState();
    drawStats();
    drawTurns();
    drawResults();
    updateCharts();
    // A finished job no longer changes once its evaluation has ended: one last full
    // refresh, then stop polling.
    if (TERMINAL.has(status.state) && results?.evaluation?.status !== "running") {
      if (finalDone && !privacyPending()) stopPoll();
      finalDone = true;
    }
  }

  // Whether a completed job's last round's privacy figures may still come: an audited
  // job, no figures of its last round yet, ended less than two minutes ago.
  function privacyPending() {
    if (!job.description?.privacy?.audit || status?.state !== "completed") return false;
    if (privacyRows.some((r) => r.round === job.rounds - 1)) return false;
    return Date.now() - new Date(status.state_changed_at).getTime() < 120_000;
  }

  async function evaluateAgain() {
    busy = true;
    drawResults();
    evaluateError.textContent = "";
    try {
      results = await api(`jobs/${jobId}/evaluate/`, { method: "POST" });
      toast(`Evaluation ${results.evaluation?.attempt ?? ""} of job ${job.id} started.`);
      // Polling stopped once the last evaluation ended: follow the new one.
      if (finalDone) {
        finalDone = false;
        stopPoll();
        stopPoll = every(POLL_SECONDS, refresh);
      }
    } catch (error) {
      evaluateError.textContent = error.message;
    } finally {
      busy = false;
    }
    drawResults();
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
  drawAlignment();
  drawLeakage();
  drawResults();
  drawHijack();
  privacy.draw(job, privacyRows);
  stopPoll = every(POLL_SECONDS, refresh);
  return () => {
    stopped = true;
    stopPoll();
    for (const chart of [lossChart, valChart, bytesChart]) chart?.destroy();
  };
}
