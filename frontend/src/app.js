// The dashboard: a hash router over pages that read and write through the REST API.
// Pages refresh themselves by polling (see pages/*.js): simple, works through every
// proxy a hospital network may have, and the API already answers in a few queries.

import { api, ApiError, CoordinatorUnreachable, isReachable, onReachability, setReachable } from "./api.js";
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
// Whether a session may exist: the page says so as it is served (a signed-out visitor is
// sent to the sign-in form without asking /api/auth/me/, which would answer 401 and log
// an error in the browser's console). Signing in sets it, signing out clears it.
let maySignedIn = document.querySelector('meta[name="medsplit-signed-in"]')?.content === "1";

export function signedIn(me) {
  session.me = me;
  maySignedIn = Boolean(me);
}

// -- the coordinator's reachability ------------------------------------------------------
// Every request goes through api.js, which reports whether an answer came. While none
// does, a banner says so on every page (and the polling pages keep retrying); a small
// probe of a static file notices the coordinator is back on pages that do not poll.
const PROBE_SECONDS = 3;
let probeTimer = null;
let renderFailed = false; // the page could not even be built: build it again once back

function showReachability(now) {
  const banner = document.getElementById("unreachable");
  if (!banner) return;
  banner.hidden = now;
  document.body.classList.toggle("coordinator-away", !now);
  if (now) {
    banner.textContent = "";
    clearTimeout(probeTimer);
    probeTimer = null;
    if (renderFailed) render();
    return;
  }
  const since = new Date().toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  banner.textContent = `The coordinator at ${window.location.origin} is not answering; retrying… (since ${since}; what the page shows is from before)`;
  if (!probeTimer) probe();
}

async function probe() {
  probeTimer = setTimeout(async () => {
    try {
      const answer = await fetch(document.querySelector('link[rel="icon"]')?.href || "/", {
        method: "HEAD",
        cache: "no-store",
      });
      if (![502, 503, 504].includes(answer.status)) setReachable(true);
    } catch {
      // still away
    }
    if (!isReachable()) probe();
  }, PROBE_SECONDS * 1000);
}

onReachability(showReachability);

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
  signedIn(null);
  window.location.hash = "#/sign-in";
}

export async function render() {
  if (stopCurrent) stopCurrent();
  stopCurrent = null;
  // A page's filters may follow a "?" in the hash (e.g. #/audit?action=turn.failed).
  const [path, queryString = ""] = ((window.location.hash || "#/").slice(1) || "/").split("?");
  const query = new URLSearchParams(queryString);
  const main = document.getElementById("main");
  renderFailed = false;
  if (!session.me && path !== "/sign-in") {
    if (!maySignedIn) {
      window.location.hash = "#/sign-in";
      return;
    }
    try {
      signedIn(await api("auth/me/"));
    } catch (error) {
      if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
        signedIn(null);
        window.location.hash = "#/sign-in";
        return;
      }
      if (error instanceof CoordinatorUnreachable) {
        renderFailed = true; // the banner says why; built again once it answers
        main.replaceChildren(el("div", { class: "page" }, el("p", { class: "muted" }, "Waiting for the coordinator…")));
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
      if (error instanceof CoordinatorUnreachable) renderFailed = true;
      root.replaceChildren(errorBox(error));
    }
    document.title = `${root.querySelector("h1")?.textContent || "MedSplit"} · MedSplit`;
    return;
  }
  main.replaceChildren(el("div", { class: "page" }, el("h1", {}, "Not found")));
}

export function errorBox(error) {
  const notFound = error instanceof ApiError && error.status === 404;
  const away = error instanceof CoordinatorUnreachable;
  return el(
    "div",
    { class: "error-box", role: "alert" },
    el("h1", {}, notFound ? "Not found" : away ? "The coordinator is not answering" : "Something went wrong"),
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
