// A new job (consortium admins): POST /api/jobs/ with the fields of
// training.validation.JobInput; the server checks everything and answers 400 with
// details per field, which are shown beside the field of the same name.
//
// Reads: GET /api/models/ (the registry), GET /api/model-modules/ (the modules whose
// MODULE:FACTORY models the coordinator builds, MEDSPLIT_MODEL_MODULES), GET /api/modes/
// (the split-learning modes as each describes itself: the mode choices, their help, how
// many cuts each takes and its options),
// GET /api/codecs/ (the codec choices, which is exact, a line each), GET /api/optimizers/
// (the optimizer choices and the options each reads, with their defaults),
// GET /api/hospitals/?status=enrolled (who may take part, with the shape of the data
// they reported) and
// GET /api/models/<name>/cuts/?input_shape=c,h,w[&model_args=<json>] (the cut table at
// the participants' shape; a factory's with its arguments; a vertical party's own model's
// at its shape), GET /api/tasks/ (the tasks, each with its losses, default loss and
// validation metric) and GET /api/augmentations/ (the transforms a job may name, each
// with its parameters' defaults); a coordinator that answers 404 to either has no such
// choice, and the form does not offer it. "Create and schedule" also POSTs
// /api/jobs/<id>/schedule/.

import { api, apiAll } from "../api.js";
import { isConsortiumAdmin } from "../app.js";
import { badge, bytes, el, field, showErrors, toast } from "../ui.js";
import { privacyOptions } from "./privacy-options.js";

const ON_FAILURE = [
  ["retry", "retry the turn (up to the retries below), then fail the job"],
  ["skip", "skip the turn and go on with the next hospital"],
  ["fail", "fail the job at once"],
];
// How the form labels an optimizer's options; one the coordinator adds later shows its name.
const OPTION_LABELS = { lr: "Learning rate", momentum: "Momentum", weight_decay: "Weight decay" };

// What a mode's own help does not say about the order of the participants.
const MODE_NOTES = {
  vertical:
    "The first participant (the top of the list) is the label party: it holds the labels. " +
    "The parties hold different features of the same patients and take each step together.",
};
// A MODULE:FACTORY name as the coordinator takes it (medsplit.models.factory).
const FACTORY_NAME = /^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_ARGS_BYTES = 4096;
const ARGS_REFUSED = "The model arguments are not a JSON object of at most 4096 bytes.";

/** Whether the parties of ``mode`` (a GET /api/modes/ entry) hold different features of
 * the same records, so that one other than the label party may run a front of its own
 * (party_models): GET /api/modes/ says so (feature_sets). */
export const hasFeatureSets = (mode) => mode?.feature_sets === true;

/** A shape typed as "c,h,w" (or "[1, 28, 28]"): ``{ shape }``, or ``{ problem }``. */
export function parseShape(text) {
  const parts = text.replace(/[[\]\s]/g, "").split(",").filter(Boolean);
  const shape = parts.map(Number);
  if (!parts.length || shape.some((n) => !Number.isInteger(n) || n < 1)) {
    return { problem: "The input shape is positive whole numbers separated by commas, such as 1,28,28." };
  }
  return { shape };
}

/** A registry answer, or ``null`` where this coordinator has no such list (404). */
const unlessMissing = (promise) => promise.catch((error) => (error.status === 404 ? null : Promise.reject(error)));

/** The model arguments typed in ``text``: ``{ args }``, or ``{ problem }`` in words. */
export function parseModelArgs(text) {
  const trimmed = text.trim();
  if (trimmed === "") return { args: {} };
  let args;
  try {
    args = JSON.parse(trimmed);
  } catch (error) {
    return { problem: `Model arguments must be JSON: ${error.message}.` };
  }
  if (args === null || typeof args !== "object" || Array.isArray(args)) {
    return { problem: 'Model arguments must be a JSON object, such as {"in_channels": 1}.' };
  }
  const size = new TextEncoder().encode(JSON.stringify(args)).length;
  if (size > MAX_ARGS_BYTES) {
    return { problem: `Model arguments are ${size} bytes of JSON; the coordinator takes at most ${MAX_ARGS_BYTES}.` };
  }
  return { args };
}

const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 });
const whole = new Intl.NumberFormat();



/** A fieldset that receives the API's errors for ``name`` (its error line comes first). */
function group(name, legend, ...children) {
  return el(
    "fieldset",
    { class: "field", "data-field": name, "aria-describedby": `${name}-error` },
    el("legend", {}, legend),
    el("p", { class: "field-error", id: `${name}-error`, role: "alert" }),
    ...children,
  );
}

/** A plain fieldset (its fields carry their own errors). */
function section(legend, ...children) {
  return el("fieldset", {}, el("legend", {}, legend), ...children);
}

function numberInput(name, value, { min, max, step = "1", placeholder } = {}) {
  return el("input", {
    name,
    type: "number",
    inputmode: step === "1" ? "numeric" : "decimal",
    min,
    max,
    step,
    value: value ?? "",
    placeholder,
  });
}

function select(name, options, value) {
  return el(
    "select",
    { name },
    options.map(([v, label]) => el("option", { value: v, selected: v === value }, label)),
  );
}

/** The number typed in ``input``: ``undefined`` when blank, the text itself when not a
 * number (so the server names the problem beside the field). */
function numberOf(input) {
  const text = input.value.trim();
  if (text === "") return input.validity?.badInput ? input.value : undefined;
  const value = Number(text);
  return Number.isFinite(value) ? value : text;
}

/** The shape every chosen hospital reported, or why there is none. */
function commonShape(chosen) {
  const shapes = chosen
    .map((h) => [h, h.dataset_summary?.image_shape])
    .filter(([, shape]) => Array.isArray(shape));
  if (!shapes.length) return { shape: null, problem: null };
  const keys = new Set(shapes.map(([, shape]) => shape.join(",")));
  if (keys.size > 1) {
    const listed = shapes.map(([h, shape]) => `${h.slug} [${shape.join(", ")}]`).join(", ");
    return { shape: shapes[0][1], problem: `The hospitals report different image shapes: ${listed}.` };
  }
  return { shape: shapes[0][1], problem: null };
}

const NUMBER_WORDS = { 1: "one", 2: "two", 3: "three", 4: "four" };

/** What a segment of a model cut ``cuts`` times is, in words. */
function spanOf(index, cuts) {
  if (index === 0) return cuts === 1 ? "the layers up to it" : "the layers before the first";
  if (index === cuts) return cuts === 1 ? "the rest" : "after the last";
  return cuts === 2 ? "those between" : `those between cuts ${index} and ${index + 1}`;
}

function listed(items) {
  if (!items.length) return "nothing";
  const [first, ...rest] = items;
  const all = [/^the |^those /.test(first) ? first : `the layers ${first}`, ...rest];
  return all.length > 1 ? `${all.slice(0, -1).join(", ")} and ${all[all.length - 1]}` : all[0];
}

/** How to pick the cuts of ``mode`` (a GET /api/modes/ entry), and who runs what. */
function cutHelpFor(mode) {
  if (!mode) return "";
  const count = mode.cuts === 1 ? "choose one cut" : `tick ${NUMBER_WORDS[mode.cuts] || mode.cuts} cuts`;
  const runs = (side) =>
    listed(mode.segments.filter((s) => s.side === side).map((s) => spanOf(s.index, mode.cuts)));
  return `${mode.title}: ${count}. The hospital runs ${runs("hospital")}; the server runs ${runs("server")}.`;
}

/** The fewest classes that cover every label (every mask class, for segmentation data)
 * the hospitals reported (as the server counts). */
function classesNeeded(chosen) {
  const labels = new Set();
  for (const h of chosen) {
    const summary = h.dataset_summary || {};
    const counts = (summary.task === "segmentation" ? summary.mask_classes : summary.label_counts) || {};
    for (const label of Object.keys(counts)) labels.add(label);
  }
  let needed = labels.size;
  const numeric = [...labels].filter((l) => /^\d+$/.test(l)).map(Number);
  if (numeric.length) needed = Math.max(needed, Math.max(...numeric) + 1);
  return needed;
}

/** The options of an optimizer (a GET /api/optimizers/ entry) a number field takes. */
function numberOptions(kind) {
  return (kind?.options || []).filter((o) => o.type === "int" || o.type === "float");
}

/** The fields of one party's optimizer, built from ``catalogue`` (GET /api/optimizers/):
 * its choices, and a number field for each option, shown for the optimizers that read it.
 * ``defaults`` are this form's starting values; an option it does not name starts at the
 * coordinator's default. */
function optimizerGroup(side, title, catalogue, defaults) {
  const prefix = side === "client_optimizer" ? "client" : "server";
  const kinds = catalogue.optimizers;
  const name = select(`${prefix}_opt_name`, kinds.map((k) => [k.name, k.title]), defaults.name);
  const inputs = new Map();
  for (const kind of kinds) {
    for (const option of numberOptions(kind)) {
      if (inputs.has(option.name)) continue;
      const input = numberInput(`${prefix}_opt_${option.name}`, defaults[option.name] ?? option.default, {
        min: "0",
        step: option.type === "int" ? "1" : "any",
      });
      const label = OPTION_LABELS[option.name] || option.name.replaceAll("_", " ");
      inputs.set(option.name, { input, box: field(label, input, option.help) });
    }
  }
  const reads = () => new Set(numberOptions(kinds.find((k) => k.name === name.value)).map((o) => o.name));
  const sync = () => {
    const used = reads();
    for (const [option, { input, box }] of inputs) {
      input.disabled = !used.has(option);
      box.hidden = !used.has(option);
    }
  };
  name.addEventListener("change", sync);
  sync();
  const node = group(
    side,
    title,
    el("div", { class: "row" }, field("Optimizer", name), ...[...inputs.values()].map((i) => i.box)),
  );
  const value = () => {
    const config = { name: name.value };
    for (const option of reads()) {
      const number = numberOf(inputs.get(option).input);
      if (number !== undefined) config[option] = number;
    }
    return config;
  };
  return { node, value };
}

export async function render(root) {
  root.append(el("h1", {}, "New job"));
  if (!isConsortiumAdmin()) {
    root.append(
      el("p", {}, "Only consortium admins can create jobs. "),
      el("p", {}, el("a", { href: "#/jobs" }, "Back to the jobs")),
    );
    return null;
  }

  const [models, modelModules, allModes, codecs, optimizers, hospitalsRaw, tasks, augmentations] = await Promise.all([
    api("models/"),
    // A coordinator that does not say (older, or not to this person): the form then offers
    // the field without the list, and the coordinator still refuses a module it does not list.
    api("model-modules/").catch((error) => ([403, 404].includes(error.status) ? null : Promise.reject(error))),
    api("modes/"),
    api("codecs/"),
    api("optimizers/"),
    apiAll("hospitals/", { status: "enrolled", page_size: 500 }),
    unlessMissing(api("tasks/")),
    unlessMissing(api("augmentations/")),
  ]);
  const hospitals = (hospitalsRaw || []).filter((h) => h.status === "enrolled");
  const bySlug = new Map(hospitals.map((h) => [h.slug, h]));

  // -- the fields --------------------------------------------------------------------
  const name = el("input", { name: "name", maxlength: "200", placeholder: "e.g. pneumonia, round robin" });
  const model = el(
    "select",
    { name: "model", required: true },
    models.map((m) => el("option", { value: m.name }, m.name)),
  );
  const modelHelp = el("p", { class: "help" });
  // A model from the registry, or a factory in a module the coordinator lists
  // (MODULE:FACTORY with its keyword arguments as JSON).
  const modelKind = el(
    "div",
    { class: "row", role: "radiogroup", "aria-label": "Where the model comes from" },
    el("label", {}, el("input", { type: "radio", name: "model_kind", value: "registry", checked: true }), " From the registry"),
    el(
      "label",
      {},
      el("input", { type: "radio", name: "model_kind", value: "factory", "data-testid": "model-kind-factory" }),
      " A model from a listed module",
    ),
  );
  const listedModules = modelModules?.modules || [];
  const factoryName = el("input", {
    name: "model",
    id: "f-model-factory",
    type: "text",
    autocomplete: "off",
    spellcheck: "false",
    list: "model-modules",
    placeholder: listedModules.length ? `${listedModules[0]}:factory` : "package.module:factory",
  });
  const modulesList = el(
    "datalist",
    { id: "model-modules" },
    listedModules.map((m) => el("option", { value: `${m}:` })),
  );
  const modulesHelp = el(
    "p",
    { class: "help", "data-testid": "model-modules" },
    !modelModules
      ? "The coordinator does not say which modules it lists; it refuses a module it does not."
      : listedModules.length
        ? `Modules this coordinator lists (${modelModules.setting}): ${listedModules.join(", ")}. Every participant's agent must list the module too (its model_modules).`
        : `This coordinator lists no model modules: add one to ${modelModules.setting} to train a model from it.`,
  );
  const modelArgs = el("textarea", {
    name: "model_args",
    rows: "3",
    spellcheck: "false",
    placeholder: '{"in_channels": 1, "num_classes": 2}',
  });
  const registryBox = el("div", {}, field("Model", model), modelHelp);
  const factoryBox = el(
    "div",
    { class: "factory-model" },
    field("Model (MODULE:FACTORY)", factoryName),
    modulesList,
    modulesHelp,
    field(
      "Model arguments (JSON)",
      modelArgs,
      `the factory's keyword arguments, a JSON object of at most ${MAX_ARGS_BYTES} bytes; they decide its classes`,
    ),
  );
  const modelBox = el("div", {}, registryBox);
  const isFactory = () => modelKind.querySelector("input:checked")?.value === "factory";
  // The registry's first mode is the default a job gets when it does not say. A mode with
  // options is offered once per configuration (its options' choices, as GET /api/modes/
  // lists them: SplitFed's variant and where the labels are). A mode or configuration the
  // platform does not run yet (runs_on_platform false: in process only) is not offered;
  // the coordinator would refuse its job.
  const modes = allModes.flatMap((m) =>
    m.configurations?.length
      ? m.configurations
          .filter((c) => c.runs_on_platform !== false)
          .map((c) => ({
            ...m,
            ...c,
            key: `${m.name}:${JSON.stringify(c.options)}`,
            mode_options: c.options,
            settings: m.options || [],
          }))
      : m.runs_on_platform !== false
        ? [{ ...m, key: m.name, settings: m.options || [] }]
        : [],
  );
  const modeByName = new Map(modes.map((m) => [m.key, m]));
  const mode = select("mode", modes.map((m) => [m.key, m.title]), modes[0]?.key);
  const currentMode = () => modeByName.get(mode.value);
  const modeHelp = el("p", { class: "help", "aria-live": "polite" });
  const modeHelpText = (m) => [m?.summary, MODE_NOTES[m?.name]].filter(Boolean).join(". ");
  // A mode's options without choices (vertical's min_records): a field each, per mode, with
  // the mode's default and help; the options with choices come from the configuration.
  const modeOptionInputs = new Map(); // "mode:option" -> { option, input, box }
  const modeOptionsRow = el("div", { class: "row" });
  const modeOptions = group("mode_options", "Mode options", modeOptionsRow);
  // (A configuration's own ``options`` are its choices; the mode's list is ``settings``.)
  const freeOptions = (m) => (m?.settings || []).filter((o) => !o.choices?.length);
  function modeOptionInput(m, option) {
    const key = `${m.name}:${option.name}`;
    if (!modeOptionInputs.has(key)) {
      const name = `mode_opt_${option.name}`;
      const input =
        option.type === "bool"
          ? el("input", { name, type: "checkbox", checked: Boolean(option.default) })
          : option.type === "str"
            ? el("input", { name, type: "text", value: option.default ?? "" })
            : numberInput(name, option.default, { step: option.type === "int" ? "1" : "any" });
      const label = option.name.replaceAll("_", " ");
      const help = `${option.help}; default ${option.default}`;
      modeOptionInputs.set(key, { option, input, box: field(label[0].toUpperCase() + label.slice(1), input, help) });
    }
    return modeOptionInputs.get(key);
  }
  function drawModeOptions() {
    const m = currentMode();
    const free = freeOptions(m);
    modeOptions.hidden = !free.length;
    modeOptionsRow.replaceChildren(...free.map((o) => modeOptionInput(m, o).box));
  }
  function modeOptionsValue() {
    const m = currentMode();
    if (!m) return undefined;
    const values = { ...(m.mode_options || {}) };
    for (const option of freeOptions(m)) {
      const { input } = modeOptionInput(m, option);
      const value =
        option.type === "bool" ? input.checked : option.type === "str" ? input.value : numberOf(input);
      if (value !== undefined) values[option.name] = value;
    }
    return Object.keys(values).length ? values : undefined;
  }
  // -- task and loss (GET /api/tasks/; none offered by a coordinator without them) ------
  const taskList = tasks || [];
  const task = select("task", taskList.map((t) => [t.name, t.name]), taskList[0]?.name);
  const loss = el("select", { name: "loss" });
  const taskHelp = el("p", { class: "help", "aria-live": "polite", "data-testid": "task-help" });
  const currentTask = () => taskList.find((t) => t.name === task.value);
  function drawLosses() {
    const t = currentTask();
    loss.replaceChildren(
      ...(t?.losses || []).map((name) =>
        el("option", { value: name, selected: name === t.default_loss }, name === t.default_loss ? `${name} (default)` : name),
      ),
    );
    taskHelp.textContent = t?.description || "";
  }
  // Until the admin picks one, the task of the data the chosen hospitals report.
  let taskTouched = false;
  task.addEventListener("change", () => {
    taskTouched = true;
    drawLosses();
  });
  // A mode whose parties hold different features of a record classifies only (the
  // coordinator refuses a segmentation job there): its task is fixed, and says so.
  const taskNotHere = el(
    "p",
    { class: "help", "data-testid": "task-not-here", hidden: true },
    "This mode classifies only: its parties hold different features of each record, not images with masks.",
  );
  const classifier = () => taskList.find((t) => t.metric === "accuracy")?.name || "classification";
  function drawTask() {
    const fixed = hasFeatureSets(currentMode());
    task.disabled = fixed;
    taskNotHere.hidden = !fixed;
    if (fixed && task.value !== classifier()) {
      task.value = classifier();
      drawLosses();
    } else if (!fixed) {
      taskFromData(chosenHospitals());
    }
  }
  function taskFromData(chosen) {
    const held = new Set(chosen.map((h) => h.dataset_summary?.task || "classification"));
    if (taskTouched || held.size !== 1 || task.disabled) return;
    const [name] = held;
    if (taskList.some((t) => t.name === name) && task.value !== name) {
      task.value = name;
      drawLosses();
    }
  }
  drawLosses();
  const taskBox = el(
    "div",
    { class: "row", "data-testid": "task-fields", hidden: !tasks },
    el("div", {}, field("Task", task), taskHelp, taskNotHere),
    field("Loss", loss, "the task's losses (MONAI's for segmentation)"),
  );

  // -- augmentation (GET /api/augmentations/) ---------------------------------------------
  // The job's transforms in order, each with its parameters; every party applies them the
  // same way (seeded per step from the job's seed).
  const transformList = augmentations || [];
  const augmentRows = []; // { kind, node, inputs: Map(param -> input) }
  const augmentListBox = el("ol", { class: "augmentations", "aria-label": "Transforms, in the order applied" });
  const augmentAdd = select("augmentation_add", transformList.map((t) => [t.name, t.name]), transformList[0]?.name);
  augmentAdd.id = "f-augmentation-add";
  const augmentHelp = el("p", { class: "help", "aria-live": "polite" });
  const syncAugmentHelp = () => {
    augmentHelp.textContent = transformList.find((t) => t.name === augmentAdd.value)?.description || "";
  };
  augmentAdd.addEventListener("change", syncAugmentHelp);
  syncAugmentHelp();
  function paramInput(name, fallback) {
    if (typeof fallback === "boolean") return el("input", { name, type: "checkbox", checked: fallback });
    if (typeof fallback === "number") return numberInput(name, fallback, { step: "any" });
    const text = typeof fallback === "string" ? fallback : JSON.stringify(fallback);
    return el("input", { name, type: "text", value: text ?? "", spellcheck: "false" });
  }
  function paramValue(input, fallback) {
    if (typeof fallback === "boolean") return input.checked;
    if (typeof fallback === "number") return numberOf(input);
    if (typeof fallback === "string") return input.value;
    try {
      return JSON.parse(input.value); // lists and the like, as JSON (the server checks them)
    } catch {
      return input.value;
    }
  }
  let transformsAdded = 0; // ids stay unique when one is removed and another added
  function addTransform(kind) {
    const index = transformsAdded++;
    const inputs = new Map();
    const row = { kind, inputs };
    const fields = Object.entries(kind.params || {}).map(([param, fallback]) => {
      const input = paramInput(`augment_${index}_${param}`, fallback);
      input.id = `f-augment-${index}-${param}`;
      inputs.set(param, input);
      return field(param.replaceAll("_", " "), input, `default ${JSON.stringify(fallback)}`);
    });
    row.node = el(
      "li",
      { "data-transform": kind.name, "data-testid": `transform-${index}` },
      el("div", {}, el("strong", {}, kind.name), " ", el("span", { class: "muted" }, kind.description || "")),
      el("div", { class: "row" }, ...fields),
      el(
        "button",
        {
          type: "button",
          class: "secondary",
          "aria-label": `Remove ${kind.name}`,
          onclick: () => {
            augmentRows.splice(augmentRows.indexOf(row), 1);
            drawTransforms();
            augmentAdd.focus();
          },
        },
        "Remove",
      ),
    );
    augmentRows.push(row);
    drawTransforms();
    row.inputs.values().next().value?.focus();
  }
  function drawTransforms() {
    augmentListBox.replaceChildren(...augmentRows.map((r) => r.node));
    augmentNone.hidden = augmentRows.length > 0;
  }
  const augmentNone = el("p", { class: "muted" }, "None: the images are used as they are.");
  const augmentation = group(
    "augmentation",
    "Augmentation",
    el(
      "p",
      { class: "help" },
      "Random transforms applied to each training batch, in this order (to the image and, for segmentation, its mask alike), drawn from the job's seed at each step: a resumed turn draws the same ones.",
    ),
    augmentNone,
    augmentListBox,
    el(
      "div",
      { class: "row" },
      el("div", {}, field("Transform to add", augmentAdd), augmentHelp),
      el(
        "div",
        { class: "actions" },
        el(
          "button",
          {
            type: "button",
            class: "secondary",
            "data-testid": "add-transform",
            onclick: () => {
              const kind = transformList.find((t) => t.name === augmentAdd.value);
              if (kind) addTransform(kind);
            },
          },
          "Add transform",
        ),
      ),
    ),
  );
  augmentation.hidden = !augmentations;
  // Parties that hold different features of a record cannot transform their parts alike.
  const augmentControls = [...augmentation.children].slice(2);
  const augmentNotHere = el(
    "p",
    { class: "help", "data-testid": "augmentation-not-here", hidden: true },
    "Not available in this mode: each party would transform its own features of a record, and the parts would no longer agree.",
  );
  augmentation.append(augmentNotHere);
  const augments = () => !hasFeatureSets(currentMode());
  function drawAugmentation() {
    for (const node of augmentControls) node.hidden = !augments() || (node === augmentNone && augmentRows.length > 0);
    augmentNotHere.hidden = augments();
  }
  // -- privacy (medsplit/defenses/options.py) ---------------------------------------------
  const privacy = privacyOptions();

  const augmentationValue = () =>
    augmentRows.map(({ kind, inputs }) => {
      const item = { name: kind.name };
      for (const [param, input] of inputs) {
        const value = paramValue(input, kind.params[param]);
        if (value !== undefined) item[param] = value;
      }
      return item;
    });

  const numClasses = numberInput("num_classes", 2, { min: "2", max: "10000" });
  let numClassesTouched = false;
  numClasses.addEventListener("input", () => {
    numClassesTouched = true;
  });

  // Participants: a checkbox per enrolled hospital; the chosen ones take turns in the
  // order of the list, which the up/down buttons change.
  const order = hospitals.map((h) => h.slug);
  const chosen = new Set();
  const participantList = el("ol", { class: "participants", "aria-label": "Enrolled hospitals, in turn order" });
  const participantStatus = el("p", { class: "help", "aria-live": "polite" });
  const participants = group(
    "participants",
    "Participating hospitals and their order",
    el(
      "p",
      { class: "help" },
      "Tick the hospitals that take part, in the order of the list: round-robin modes " +
        "take turns from the top; in vertical mode every party takes each step and the " +
        "first one holds the labels. Move a hospital with its ↑ and ↓ buttons.",
    ),
    hospitals.length
      ? participantList
      : el("p", { class: "warn" }, "No hospital is enrolled yet: enrol hospitals before creating a job."),
    participantStatus,
  );

  // -- a vertical party's own model (party_models) -----------------------------------------
  // A party other than the label party (the first) may run a front of its own on its own
  // features: a model, its arguments, the shape of its data and where its front ends. Its
  // front's output meets the others' at the server (the join), so the cut's crossing
  // shape is shown beside each cut.
  const partyState = new Map(); // slug -> { own, model, args, shape, cut, status, box, request }
  const partyList = el("ul", { class: "participants party-models" });
  const partyModels = group(
    "party_models",
    "The other parties' models",
    el(
      "p",
      { class: "help" },
      "Each party other than the label party runs the job's model up to its first cut unless it runs a model of its own here, on the features it holds.",
    ),
    partyList,
  );
  const modelChoices = el(
    "datalist",
    { id: "party-model-choices" },
    models.map((m) => el("option", { value: m.name })),
    (modelModules?.modules || []).map((m) => el("option", { value: `${m}:` })),
  );
  function partyOf(h) {
    if (partyState.has(h.slug)) return partyState.get(h.slug);
    const slug = h.slug;
    const own = el("input", { type: "checkbox", "data-testid": `party-model-${slug}` });
    const modelIn = el("input", {
      type: "text",
      id: `f-party-${slug}-model`,
      name: `party_${slug}_model`,
      list: "party-model-choices",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "a registry model or MODULE:FACTORY",
    });
    const args = el("textarea", { id: `f-party-${slug}-args`, name: `party_${slug}_model_args`, rows: "2", spellcheck: "false", placeholder: "{}" });
    const reported = h.dataset_summary?.image_shape;
    const shape = el("input", {
      type: "text",
      id: `f-party-${slug}-shape`,
      name: `party_${slug}_input_shape`,
      value: Array.isArray(reported) ? reported.join(",") : "",
      placeholder: "c,h,w",
    });
    const cut = el("select", { id: `f-party-${slug}-cut`, name: `party_${slug}_cut` });
    const status = el("p", { class: "help", "aria-live": "polite" });
    const fields = el(
      "div",
      { class: "row", hidden: true },
      field("Its model", modelIn),
      field("Its model arguments (JSON)", args, "blank: none"),
      field("Its input shape", shape, Array.isArray(reported) ? "as it reports its data" : "it has not reported its data"),
      el("div", {}, field("Its front ends after", cut), status),
    );
    const state = { own, modelIn, args, shape, cut, status, fields, request: 0 };
    own.addEventListener("change", () => {
      fields.hidden = !own.checked;
      if (own.checked) {
        if (!modelIn.value) modelIn.value = currentModel()?.name || "";
        loadPartyCuts(state);
        modelIn.focus();
      }
    });
    for (const input of [modelIn, args, shape]) input.addEventListener("change", () => loadPartyCuts(state));
    state.box = el(
      "li",
      { "data-party": slug },
      el("label", {}, own, el("span", {}, el("strong", {}, h.name), " runs a model of its own")),
      fields,
    );
    partyState.set(slug, state);
    return state;
  }
  async function loadPartyCuts(state) {
    const name = state.modelIn.value.trim();
    const { args, problem: argsProblem } = parseModelArgs(state.args.value);
    const { shape, problem: shapeProblem } = parseShape(state.shape.value);
    const ask = ++state.request;
    const wait = (text, kind = "help") => {
      state.cut.replaceChildren();
      state.status.className = kind;
      state.status.textContent = text;
    };
    if (!name) return wait("Name its model to see where its front may end.");
    if (argsProblem || shapeProblem) return wait(argsProblem || shapeProblem, "help warn");
    const argsText = Object.keys(args).length ? JSON.stringify(args) : undefined;
    const key = `${name}|${shape.join(",")}|${argsText || ""}`;
    wait("Loading its cut table…");
    let answer = cutCache.get(key);
    try {
      if (!answer) {
        answer = await api(`models/${encodeURIComponent(name)}/cuts/`, { query: { input_shape: shape.join(","), model_args: argsText } });
        cutCache.set(key, answer);
      }
    } catch (error) {
      if (ask !== state.request) return;
      if (error.status === 429) {
        const again = Math.min(Math.max(error.retryAfter ?? 5, 1), 60);
        wait(`The coordinator is busy working out cut tables; asking again in ${again} s…`);
        setTimeout(() => ask === state.request && loadPartyCuts(state), again * 1000);
        return;
      }
      const why = Object.values(error.details || {}).flat().join(" ");
      return wait(`${error.message}${why ? `: ${why}` : ""}`, "help warn");
    }
    if (ask !== state.request) return;
    const rows = answer.cuts || [];
    const front = (row) => (row.crossing || []).map((t) => `[${t.shape.join(", ")}]`).join(" + ");
    state.cut.replaceChildren(...rows.map((row) => el("option", { value: row.name }, `${row.name} → ${front(row)}`)));
    // Where the job's own front ends, if this model has that cut too.
    const jobCut = chosenCuts()[0];
    if (rows.some((r) => r.name === jobCut)) state.cut.value = jobCut;
    state.status.className = "help";
    const jobRow = cutRows.find((r) => r.name === jobCut);
    const theirs = jobRow ? ` The label party's front (the job's model up to ${jobRow.name}) sends ${front(jobRow)}.` : "";
    state.status.textContent = rows.length
      ? `Beside each cut: the tensor its front sends, which must fit the join with the other parties' fronts.${theirs}`
      : "This model has no cut points.";
  }
  /** The passive parties of the chosen mode (every chosen hospital but the first). */
  const passiveParties = () => (hasFeatureSets(currentMode()) ? chosenHospitals().slice(1) : []);
  function drawPartyModels() {
    const passive = passiveParties();
    partyModels.hidden = !passive.length;
    partyList.replaceChildren(...passive.map((h) => partyOf(h).box));
  }
  function partyModelsValue() {
    const value = {};
    for (const h of passiveParties()) {
      const state = partyOf(h);
      if (!state.own.checked) continue;
      const { args } = parseModelArgs(state.args.value);
      const { shape } = parseShape(state.shape.value);
      value[h.slug] = {
        model: state.modelIn.value.trim(),
        model_args: args ?? state.args.value, // the server names what is wrong with them
        input_shape: shape ?? state.shape.value,
        cut: state.cut.value,
      };
    }
    return Object.keys(value).length ? value : undefined;
  }

  const shapeOut = el("output", { id: "job-input-shape", "aria-live": "polite" }, "–");
  const shapeNote = el("p", { class: "help", "aria-live": "polite" });
  const shapeBox = el(
    "div",
    { class: "field", "data-field": "input_shape" },
    el("span", { style: "display:block;font-weight:600;margin-bottom:.2rem", id: "job-input-shape-label" }, "Input shape"),
    shapeOut,
    shapeNote,
    el("p", { class: "field-error", role: "alert" }),
  );
  shapeOut.setAttribute("aria-labelledby", "job-input-shape-label");

  const cutTableBox = el("div", { class: "cut-table" }, el("p", { class: "muted" }, "Choose a model."));
  const cutHelp = el("p", { class: "help", id: "cuts-help" });
  const cuts = group("cuts", "Cut point", cutHelp, cutTableBox);

  const client = optimizerGroup("client_optimizer", "Client optimizer (at the hospitals)", optimizers, {
    name: "sgd",
    lr: 0.05,
    momentum: 0.9,
    weight_decay: 0,
  });
  const server = optimizerGroup("server_optimizer", "Server optimizer (at the coordinator)", optimizers, {
    name: "adam",
    lr: 0.001,
    momentum: 0,
    weight_decay: 0,
  });

  const batchSize = numberInput("batch_size", 32, { min: "1", max: "4096" });
  const localEpochs = numberInput("local_epochs", 1, { min: "1", max: "100" });
  const maxSteps = numberInput("max_steps_per_turn", "", { min: "1", max: "1000000", placeholder: "no limit" });
  const rounds = numberInput("rounds", 1, { min: "1", max: "1000" });
  // The codecs as the coordinator lists them; an exact one (training stays exact) first chosen.
  const codec = select(
    "codec",
    codecs.map((c) => [c.name, c.exact ? `${c.name} (exact)` : c.name]),
    (codecs.find((c) => c.exact) || codecs[0])?.name,
  );
  const codecHelp = el("p", { class: "help", "aria-live": "polite" });
  const syncCodec = () => {
    codecHelp.textContent = codecs.find((c) => c.name === codec.value)?.summary || "";
  };
  codec.addEventListener("change", syncCodec);
  syncCodec();
  const seed = numberInput("seed", 0, { min: "0", max: String(2 ** 31 - 1) });
  const onFailure = select("on_failure", ON_FAILURE, "retry");
  const maxRetries = numberInput("max_retries", 2, { min: "0", max: "10" });
  // A parallel round's limit (SplitFed): its turns, then its secure aggregation.
  const roundDeadline = numberInput("round_deadline_seconds", 3600, { min: "10", max: String(7 * 86400) });
  const syncRetries = () => {
    maxRetries.disabled = onFailure.value !== "retry";
  };
  onFailure.addEventListener("change", syncRetries);
  syncRetries();

  const createButton = el("button", { type: "submit", "data-testid": "create-job", value: "create" }, "Create job");
  const scheduleButton = el(
    "button",
    { type: "submit", class: "secondary", "data-testid": "create-and-schedule", value: "schedule" },
    "Create and schedule",
  );
  const formError = el("p", { class: "form-error", role: "alert", tabindex: "-1" });

  const form = el(
    "form",
    { class: "job-form", novalidate: true, "data-testid": "job-form", "aria-label": "New job" },
    section(
      "Job",
      el(
        "div",
        { class: "row" },
        field("Name", name, "optional; shown in lists"),
        el("div", {}, modelKind, modelBox),
        el("div", {}, field("Mode", mode), modeHelp),
        field("Number of classes", numClasses, "at least the labels (the mask classes) the hospitals report"),
      ),
      taskBox,
    ),
    modeOptions,
    participants,
    partyModels,
    modelChoices,
    shapeBox,
    cuts,
    client.node,
    server.node,
    section(
      "Training",
      el(
        "div",
        { class: "row" },
        field("Batch size", batchSize, "1 to 4096"),
        field("Local epochs", localEpochs, "passes over a hospital's data per turn, 1 to 100"),
        field("Max steps per turn", maxSteps, "blank: no limit"),
        field("Rounds", rounds, "every hospital takes one turn per round, 1 to 1000"),
        el("div", {}, field("Codec", codec, "how activations and gradients cross the network"), codecHelp),
        field("Seed", seed, "0 to 2147483647"),
      ),
    ),
    augmentation,
    privacy.node,
    section(
      "When a turn fails",
      el(
        "div",
        { class: "row" },
        field("Policy", onFailure),
        field("Max retries", maxRetries, "0 to 10, for the retry policy"),
        field(
          "Round deadline (s)",
          roundDeadline,
          "a parallel round's limit (SplitFed): a hospital still training, or not yet submitted to the round's secure aggregation, is left to the policy",
        ),
      ),
    ),
    formError,
    el("div", { class: "actions" }, createButton, scheduleButton, el("a", { href: "#/jobs" }, "Cancel")),
  );
  root.append(form);

  // -- participants ------------------------------------------------------------------
  function chosenHospitals() {
    return order.filter((slug) => chosen.has(slug)).map((slug) => bySlug.get(slug));
  }

  function move(slug, delta, focusClass) {
    const index = order.indexOf(slug);
    const target = index + delta;
    if (target < 0 || target >= order.length) return;
    [order[index], order[target]] = [order[target], order[index]];
    drawParticipants();
    // Keep the keyboard where it was: on the same button of the moved hospital.
    const again = participantList.querySelector(`li[data-slug="${slug}"] .${focusClass}`);
    (again && !again.disabled ? again : participantList.querySelector(`li[data-slug="${slug}"] input`))?.focus();
    drawPartyModels();
    const h = bySlug.get(slug);
    participantStatus.textContent = `${h.name} moved to place ${order.indexOf(slug) + 1} of the list.`;
  }

  function drawParticipants() {
    const turnOf = new Map(chosenHospitals().map((h, i) => [h.slug, i + 1]));
    participantList.replaceChildren(
      ...order.map((slug, index) => {
        const h = bySlug.get(slug);
        const summary = h.dataset_summary;
        const shape = summary?.image_shape;
        const train = summary?.split_sizes?.train;
        const box = el("input", {
          type: "checkbox",
          name: "participant",
          value: slug,
          checked: chosen.has(slug),
          "data-testid": `participant-${slug}`,
          onchange: (event) => {
            if (event.target.checked) chosen.add(slug);
            else chosen.delete(slug);
            drawParticipants();
            participantList.querySelector(`li[data-slug="${slug}"] input`)?.focus();
            participantsChanged();
          },
        });
        return el(
          "li",
          { "data-slug": slug, class: chosen.has(slug) ? "chosen" : null },
          el("span", { class: "order" }, turnOf.has(slug) ? `turn ${turnOf.get(slug)}` : "—"),
          el(
            "label",
            {},
            box,
            el("span", {}, el("strong", {}, h.name), " ", el("span", { class: "muted" }, `(${slug})`)),
          ),
          el(
            "span",
            { class: "muted" },
            shape ? `[${shape.join(", ")}]` : el("span", { class: "warn" }, "no data reported yet"),
            train !== undefined ? ` · ${whole.format(train)} training samples` : "",
            summary?.task === "segmentation" ? " · a mask per image" : "",
          ),
          h.online ? badge("online") : badge("offline"),
          el(
            "span",
            { class: "order-buttons actions" },
            el(
              "button",
              {
                type: "button",
                class: "secondary up",
                "aria-label": `Move ${h.name} up`,
                title: "Move up",
                disabled: index === 0,
                onclick: () => move(slug, -1, "up"),
              },
              "↑",
            ),
            el(
              "button",
              {
                type: "button",
                class: "secondary down",
                "aria-label": `Move ${h.name} down`,
                title: "Move down",
                disabled: index === order.length - 1,
                onclick: () => move(slug, 1, "down"),
              },
              "↓",
            ),
          ),
        );
      }),
    );
  }

  function participantsChanged() {
    drawPartyModels();
    const list = chosenHospitals();
    taskFromData(list);
    if (!numClassesTouched && list.length) numClasses.value = String(Math.max(2, classesNeeded(list)));
    refreshShape();
  }

  // -- input shape and cut table -----------------------------------------------------
  let shapeKey = "";
  let cutRows = [];
  let cutNote = ""; // why the table is not at the participants' shape, if it is not
  // The cuts chosen in each mode, by the mode's name (switching modes keeps them).
  const selectedCuts = Object.fromEntries(modes.map((m) => [m.key, []]));
  let cutRequest = 0;
  const cutCache = new Map();

  // The model the form is on, as the cut table and the defaults need it: a registry
  // entry, or a factory (no default shape or cuts; its arguments as parsed, or the problem).
  function currentModel() {
    if (!isFactory()) return models.find((m) => m.name === model.value);
    const name = factoryName.value.trim();
    const { args, problem } = parseModelArgs(modelArgs.value);
    return { name, factory: true, args: args || {}, problem, default_cuts: {}, default_input_shape: null };
  }

  function refreshShape() {
    const spec = currentModel();
    const { shape, problem } = commonShape(chosenHospitals());
    let use = shape;
    if (shape) {
      shapeNote.textContent = problem || "As the chosen hospitals report their data.";
      shapeNote.className = problem ? "help warn" : "help";
    } else {
      use = spec?.default_input_shape || null;
      shapeNote.className = "help";
      shapeNote.textContent = chosenHospitals().length
        ? "The chosen hospitals have not reported their data yet; showing the model's default shape."
        : "Choose hospitals to use the shape of their data; until then, the model's default.";
    }
    shapeOut.textContent = use ? `[${use.join(", ")}]` : "–";
    const key = `${spec?.name || ""}|${use ? use.join(",") : ""}|${spec?.factory ? JSON.stringify(spec.args) : ""}`;
    if (key !== shapeKey) {
      shapeKey = key;
      loadCuts(spec, use);
    }
  }

  function cutsNotYet(text) {
    ++cutRequest;
    cutRows = [];
    cutTableBox.setAttribute("aria-busy", "false");
    cutTableBox.replaceChildren(el("p", { class: "muted", "data-testid": "cuts-waiting" }, text));
  }

  async function loadCuts(spec, shape) {
    if (!spec) return;
    if (spec.factory) {
      // A factory has no shape of its own: its table is worked out at the participants'.
      if (!FACTORY_NAME.test(spec.name)) return cutsNotYet("Type the model as MODULE:FACTORY to see its cut table.");
      if (spec.problem) return cutsNotYet(`${spec.problem} The cut table waits for them.`);
      if (!shape) return cutsNotYet("Choose hospitals that reported their data: a factory model's cut table is worked out at their shape.");
    }
    const ask = ++cutRequest;
    const argsText = spec.factory && Object.keys(spec.args).length ? JSON.stringify(spec.args) : undefined;
    const key = `${spec.name}|${shape ? shape.join(",") : ""}|${argsText || ""}`;
    cutTableBox.replaceChildren(el("p", { class: "muted" }, "Loading the cut table…"));
    cutTableBox.setAttribute("aria-busy", "true");
    let answer = cutCache.get(key);
    try {
      if (!answer) {
        answer = await api(`models/${encodeURIComponent(spec.name)}/cuts/`, {
          query: { input_shape: shape ? shape.join(",") : undefined, model_args: argsText },
        }).catch(async (error) => {
          // Beyond the sizes the coordinator traces for anyone: the cuts are the same at
          // every size, so show them at the model's own shape and say so (a factory has
          // no shape of its own).
          if (error.code !== "input_too_large" || spec.factory) throw error;
          const table = await api(`models/${encodeURIComponent(spec.name)}/cuts/`);
          return { ...table, note: `${error.message} Shown at [${table.input_shape.join(", ")}].` };
        });
        cutCache.set(key, answer);
      }
    } catch (error) {
      if (ask !== cutRequest) return;
      if (error.status === 429) {
        // The coordinator traces one table at a time: it is busy, not refusing. Ask
        // again when it says, unless another model or shape was asked for meanwhile.
        const wait = Math.min(Math.max(error.retryAfter ?? 5, 1), 60);
        cutTableBox.replaceChildren(
          el("p", { class: "muted" }, `The coordinator is busy working out cut tables; asking again in ${wait} s…`),
        );
        setTimeout(() => {
          if (ask === cutRequest) loadCuts(spec, shape);
        }, wait * 1000);
        return;
      }
      cutRows = [];
      const why = Object.values(error.details || {}).flat().join(" ");
      cutTableBox.replaceChildren(
        el("p", { class: "warn", role: "alert" }, `${error.message}${why ? `: ${why}` : ""}`),
      );
      cutTableBox.setAttribute("aria-busy", "false");
      return;
    }
    if (ask !== cutRequest) return;
    cutTableBox.setAttribute("aria-busy", "false");
    cutRows = answer.cuts || [];
    cutNote = answer.note || "";
    const names = new Set(cutRows.map((r) => r.name));
    // Keep choices that still exist; otherwise start from the model's defaults in each mode.
    for (const m of modes) {
      selectedCuts[m.key] = (selectedCuts[m.key] || []).filter((c) => names.has(c));
      if (!selectedCuts[m.key].length) {
        // A configuration with another number of cuts than its mode's defaults takes the
        // defaults of a mode that cuts as often (SplitFed with the labels at home: U-shaped's).
        const defaults = Object.values(spec.default_cuts || {});
        const own = spec.default_cuts?.[m.name];
        const fits = own?.length === m.cuts ? own : defaults.find((d) => d.length === m.cuts);
        selectedCuts[m.key] = (fits || []).filter((c) => names.has(c));
      }
    }
    drawCuts();
  }

  function drawCuts() {
    const chosenMode = currentMode();
    const needed = chosenMode?.cuts || 1;
    const several = needed > 1;
    const picked = selectedCuts[mode.value] || [];
    cutHelp.textContent = cutHelpFor(chosenMode);
    if (!cutRows.length) {
      if (!cutTableBox.querySelector(".warn, .muted")) {
        cutTableBox.replaceChildren(el("p", { class: "muted" }, "This model has no cut points."));
      }
      return;
    }
    const head = el(
      "tr",
      {},
      el("th", { scope: "col" }, several ? `Use (${NUMBER_WORDS[needed] || needed})` : "Use"),
      el("th", { scope: "col" }, "Cut after"),
      el("th", { scope: "col", class: "num" }, "Client parameters"),
      el("th", { scope: "col", class: "num" }, "Client FLOPs / sample"),
      el("th", { scope: "col" }, "Crossing tensors"),
      el("th", { scope: "col", class: "num" }, "Values / sample"),
      el("th", { scope: "col", class: "num" }, "Bytes / sample"),
    );
    const body = cutRows.map((row) => {
      const id = `cut-${row.name.replace(/[^A-Za-z0-9_-]/g, "_")}`;
      const input = el("input", {
        type: several ? "checkbox" : "radio",
        name: "cuts",
        value: row.name,
        id,
        checked: picked.includes(row.name),
        "data-testid": `cut-${row.name}`,
        "aria-describedby": "cuts-help",
        onchange: (event) => {
          if (several) {
            let list = (selectedCuts[mode.value] || []).filter((c) => c !== row.name);
            if (event.target.checked) list.push(row.name);
            // At most as many as the mode cuts: one more tick replaces the oldest choice.
            if (list.length > needed) list = list.slice(-needed);
            selectedCuts[mode.value] = list;
          } else {
            selectedCuts[mode.value] = [row.name];
          }
          const focusId = event.target.id;
          drawCuts();
          document.getElementById(focusId)?.focus();
        },
      });
      const crossing = (row.crossing || [])
        .map((t) => `${t.name}: [${t.shape.join(", ")}] ${t.dtype}`)
        .join("; ");
      return el(
        "tr",
        { class: picked.includes(row.name) ? "chosen" : null },
        el("td", {}, input),
        el("td", {}, el("label", { for: id }, el("code", {}, row.name))),
        el(
          "td",
          { class: "num" },
          compact.format(row.client_params),
          el("span", { class: "muted" }, ` (${(row.client_param_share * 100).toFixed(1)} %)`),
        ),
        el("td", { class: "num" }, compact.format(row.client_flops_per_sample)),
        el("td", {}, crossing || "–"),
        el("td", { class: "num" }, whole.format(row.values_per_sample)),
        el("td", { class: "num" }, bytes(row.bytes_per_sample)),
      );
    });
    cutTableBox.replaceChildren(
      cutNote ? el("p", { class: "help warn" }, cutNote) : "",
      el(
        "table",
        {},
        el("caption", { class: "muted" }, `Cut table of ${currentModel()?.name} at ${cutNote ? "its own shape" : shapeOut.textContent}`),
        el("thead", {}, head),
        el("tbody", {}, body),
      ),
    );
  }

  function chosenCuts() {
    const picked = selectedCuts[mode.value] || [];
    // In the order of the model (the table's order), whatever order they were ticked in.
    const rank = new Map(cutRows.map((r, i) => [r.name, i]));
    return [...picked].sort((a, b) => (rank.get(a) ?? 0) - (rank.get(b) ?? 0));
  }

  function modelChanged() {
    const spec = currentModel();
    modelHelp.textContent = spec?.description || "";
    for (const name of Object.keys(selectedCuts)) selectedCuts[name] = [];
    refreshShape();
  }
  model.addEventListener("change", modelChanged);
  for (const radio of modelKind.querySelectorAll("input")) {
    radio.addEventListener("change", () => {
      // One field named model at a time, so the API's errors for it land beside it.
      modelBox.replaceChildren(isFactory() ? factoryBox : registryBox);
      modelChanged();
    });
  }
  // The factory's table is asked for once the name or the arguments are done with.
  factoryName.addEventListener("change", modelChanged);
  modelArgs.addEventListener("change", () => {
    const { problem } = parseModelArgs(modelArgs.value);
    showFieldError("model_args", problem || "");
    // The page's own refusal of them (on submit) goes with the problem.
    if (!problem && formError.textContent === ARGS_REFUSED) formError.textContent = "";
    modelChanged();
  });
  mode.addEventListener("change", () => {
    modeHelp.textContent = modeHelpText(currentMode());
    drawModeOptions();
    drawPartyModels();
    drawAugmentation();
    drawTask();
    drawCuts();
  });

  /** ``text`` beside the field ``name`` (as the API's errors are shown), or none. */
  function showFieldError(name, text) {
    const holder = form.querySelector(`[data-field="${name}"]`);
    if (!holder) return;
    holder.querySelector(".field-error").textContent = text;
    const input = holder.querySelector("input, select, textarea");
    if (text) input?.setAttribute("aria-invalid", "true");
    else input?.removeAttribute("aria-invalid");
  }

  // -- submit ------------------------------------------------------------------------
  function body() {
    const data = {
      name: name.value.trim(),
      model: isFactory() ? factoryName.value.trim() : model.value,
      mode: currentMode()?.name,
      mode_options: modeOptionsValue(),
      num_classes: numberOf(numClasses),
      cuts: chosenCuts(),
      participants: chosenHospitals().map((h) => ({ hospital: h.slug })),
      client_optimizer: client.value(),
      server_optimizer: server.value(),
      batch_size: numberOf(batchSize),
      local_epochs: numberOf(localEpochs),
      max_steps_per_turn: numberOf(maxSteps) ?? null,
      rounds: numberOf(rounds),
      codec: codec.value,
      seed: numberOf(seed),
      on_failure: onFailure.value,
      round_deadline_seconds: numberOf(roundDeadline),
    };
    if (onFailure.value === "retry") data.max_retries = numberOf(maxRetries);
    // Only what this coordinator offers (an older one refuses fields it does not know).
    if (tasks) Object.assign(data, { task: task.value, loss: loss.value });
    if (augmentations && augments()) data.augmentation = augmentationValue();
    const shielded = privacy.value();
    if (Object.keys(shielded).length) data.privacy = shielded;
    const own = partyModelsValue();
    if (own) data.party_models = own;
    if (isFactory()) data.model_args = parseModelArgs(modelArgs.value).args;
    // Blank numbers take the server's defaults (except num_classes, which is required).
    for (const key of Object.keys(data)) if (data[key] === undefined && key !== "num_classes") delete data[key];
    if (data.num_classes === undefined) data.num_classes = null;
    return data;
  }

  let busy = false;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (busy) return;
    const schedule = event.submitter?.value === "schedule";
    busy = true;
    createButton.disabled = true;
    scheduleButton.disabled = true;
    // Arguments that are not a JSON object are refused here, beside their field.
    const typed = isFactory() ? parseModelArgs(modelArgs.value) : {};
    if (typed.problem) {
      showErrors(form, { message: ARGS_REFUSED, details: { model_args: [typed.problem] } });
      modelArgs.focus();
      busy = false;
      createButton.disabled = false;
      scheduleButton.disabled = false;
      return;
    }
    const label = (event.submitter || createButton).textContent;
    (event.submitter || createButton).textContent = "Checking…";
    let job;
    try {
      job = await api("jobs/", { method: "POST", body: body() });
    } catch (error) {
      showErrors(form, error);
      // Take the keyboard to the first problem.
      const first = form.querySelector('[aria-invalid="true"]');
      (first || formError).focus();
      busy = false;
      createButton.disabled = false;
      scheduleButton.disabled = false;
      (event.submitter || createButton).textContent = label;
      return;
    }
    if (schedule) {
      try {
        await api(`jobs/${job.id}/schedule/`, { method: "POST", body: {} });
        toast(`Job ${job.id} created and scheduled.`);
      } catch (error) {
        toast(`Job ${job.id} was created as a draft but not scheduled: ${error.message}`);
      }
    } else {
      toast(`Job ${job.id} created as a draft.`);
    }
    window.location.hash = `#/jobs/${job.id}`;
  });

  drawParticipants();
  modeHelp.textContent = modeHelpText(currentMode());
  drawModeOptions();
  drawPartyModels();
  drawAugmentation();
  drawTask();
  modelHelp.textContent = currentModel()?.description || "";
  refreshShape();
  name.focus();
  return null;
}
