// The dashboard: a hash router over pages that read and write through the REST API.
// Pages refresh themselves by polling (see pages/*.js): simple, works through every
// proxy a hospital network may have, and the API already answers in a few queries.

import { api, ApiError } from "./api.js";
import { el } from "./ui.js";
import * as audit from "./pages/audit.js";
import * as hospital from "./pages/hospital.js";
import * as hospitals from "./pages/hospitals.js";
import * as job from "./pages/job.js";
import * as jobNew from "./pages/job-new.js";
import * as jobs from "./pages/jobs.js";
import * as overview from "./pages/overview.js";
import * as signIn from "./pages/sign-in.js";

const routes = [
  [/^\/$/, overview],
  [/^\/hospitals$/, hospitals],
  [/^\/hospitals\/([a-z0-9-]+)$/, hospital],
  [/^\/jobs$/, jobs],
  [/^\/jobs\/new$/, jobNew],
  [/^\/jobs\/(\d+)$/, job],
  [/^\/audit$/, audit],
  [/^\/sign-in$/, signIn],
];

export const session = { me: null };
let stopCurrent = null;

export function isConsortiumAdmin() {
  return session.me?.role === "consortium_admin";
}

function navLinks() {
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  nav.replaceChildren();
  who.replaceChildren();
  if (!session.me) return;
  const links = [
    ["#/", "Overview"],
    ["#/hospitals", "Hospitals"],
    ["#/jobs", "Jobs"],
    ["#/audit", "Audit log"],
  ];
  if (isConsortiumAdmin()) links.splice(3, 0, ["#/jobs/new", "New job"]);
  const here = (window.location.hash || "#/").split("?")[0];
  nav.append(
    el(
      "ul",
      {},
      links.map(([href, label]) =>
        el("li", {}, el("a", { href, "aria-current": here === href ? "page" : null }, label)),
      ),
    ),
  );
  const role = (session.me.role || "no role").replace("_", " ");
  who.append(
    el(
      "span",
      {},
      `${session.me.username} · ${role}`,
      session.me.hospital ? el("span", { class: "muted" }, ` · ${session.me.hospital}`) : null,
    ),
    el("button", { type: "button", class: "link", onclick: signOut }, "Sign out"),
  );
}

async function signOut() {
  await api("auth/sign-out/", { method: "POST" }).catch(() => null);
  session.me = null;
  window.location.hash = "#/sign-in";
}

export async function render() {
  if (stopCurrent) stopCurrent();
  stopCurrent = null;
  // A page's filters may follow a "?" in the hash (e.g. #/audit?action=turn.failed).
  const [path, queryString = ""] = ((window.location.hash || "#/").slice(1) || "/").split("?");
  const query = new URLSearchParams(queryString);
  const main = document.getElementById("main");
  if (!session.me && path !== "/sign-in") {
    try {
      session.me = await api("auth/me/");
    } catch (error) {
      if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
        window.location.hash = "#/sign-in";
        return;
      }
      throw error;
    }
  }
  navLinks();
  for (const [pattern, page] of routes) {
    const match = path.match(pattern);
    if (!match) continue;
    const root = el("div", { class: "page" });
    main.replaceChildren(root);
    try {
      stopCurrent = (await page.render(root, match.slice(1), session, query)) || null;
    } catch (error) {
      root.replaceChildren(errorBox(error));
    }
    document.title = `${root.querySelector("h1")?.textContent || "MedSplit"} · MedSplit`;
    return;
  }
  main.replaceChildren(el("div", { class: "page" }, el("h1", {}, "Not found")));
}

export function errorBox(error) {
  const notFound = error instanceof ApiError && error.status === 404;
  return el(
    "div",
    { class: "error-box", role: "alert" },
    el("h1", {}, notFound ? "Not found" : "Something went wrong"),
    el("p", {}, error.message),
  );
}

/** Run ``refresh`` now and every ``seconds`` while the page is shown; returns the stop. */
export function every(seconds, refresh) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      await refresh();
    } catch (error) {
      console.warn(error);
    }
    if (!stopped) timer = setTimeout(tick, seconds * 1000);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** Like app.js's ``every``, for a page that already loaded once: the first run waits. */
export function poll(seconds, refresh) {
  let first = true;
  return every(seconds, async () => {
    if (first) {
      first = false;
      return;
    }
    await refresh();
  });
}

window.addEventListener("hashchange", render);
render();
