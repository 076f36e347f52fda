// Sign in with a username and password (a session cookie; the API throttles attempts).

import { api } from "../api.js";
import { signedIn } from "../app.js";
import { el, field, showErrors } from "../ui.js";

export async function render(root) {
  const username = el("input", { name: "username", autocomplete: "username", required: true });
  const password = el("input", {
    name: "password",
    type: "password",
    autocomplete: "current-password",
    required: true,
  });
  const form = el(
    "form",
    { class: "card sign-in", novalidate: true },
    el("h1", {}, "Sign in to MedSplit"),
    field("Username", username),
    field("Password", password),
    el("p", { class: "form-error", role: "alert" }),
    el("button", { type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      signedIn(
        await api("auth/sign-in/", {
          method: "POST",
          body: { username: username.value, password: password.value },
        }),
      );
      window.location.hash = "#/";
    } catch (error) {
      showErrors(form, error);
    }
  });
  root.append(form);
  username.focus();
}
