// The gdacil console: a thin page over the server's JSON endpoints. It sends JSON with
// Content-Type: application/json, the operator's token (if any) in an Authorization header,
// never a cookie (credentials: "omit"), and writes data into the page as text only.
"use strict";

const TOKEN_KEY = "gdacil-token";
let token = sessionStorage.getItem(TOKEN_KEY) || "";
let info = null;

const $ = (id) => document.getElementById(id);

function element(tag, text, attributes = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

function say(text, problem = false) {
  const status = $("status");
  status.textContent = (problem ? "Problem: " : "") + text;
  status.setAttribute("role", problem ? "alert" : "status");
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token) headers["Authorization"] = "Bearer " + token;
  const response = await fetch(path, {
    method, headers, credentials: "omit", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch (e) { data = { error: "not a JSON answer" }; }
  if (!response.ok) {
    const error = new Error(`${method} ${path}: ${response.status}: ${data && data.error}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

function percent(part, whole) {
  return whole ? `${(100 * part / whole).toFixed(1)}%` : "none asked yet";
}

// ------------------------------------------------------------------------- the model
function showModel() {
  const facts = $("model-facts");
  facts.replaceChildren();
  const calibration = info.calibration;
  const observed = info.server.observed;
  const rows = [
    ["Version served", info.version],
    ["Backbone", `${info.backbone.name} (${info.backbone.modality || "?"})`],
    ["Head", info.head.name],
    ["Samples learned", `${info.samples} in ${info.learns} learns`],
    ["Calibration", calibration
      ? `${calibration.records} records of ${calibration.record_classes} classes, temperature `
        + `${calibration.temperature.toFixed(3)}, target reject rate ${calibration.reject_rate}`
        + (calibration.threshold === null ? " (too few records)"
          : `, threshold ${calibration.threshold.toFixed(3)} (${calibration.novelty})`)
      : "none: unknown answers and conformal sets need one"],
    ["Observed since start", `${observed.inputs} inputs answered; of the `
      + `${observed.reject_inputs} asked with rejection, ${observed.unknown} unknown `
      + `(${percent(observed.unknown, observed.reject_inputs)})`],
    ["Changes", info.server.token ? "need the server's token"
      : info.server.allow_learn ? "allowed to anyone who can reach the server"
      : "off (start the server with --allow-learn or --token-file)"],
  ];
  for (const [name, value] of rows) facts.append(element("dt", name), element("dd", value));
  const body = $("classes").tBodies[0];
  body.replaceChildren();
  const known = $("known-classes");
  known.replaceChildren();
  for (const [name, count] of Object.entries(info.classes)) {
    const row = element("tr");
    row.append(element("th", name, { scope: "row" }), element("td", count));
    body.append(row);
    known.append(element("option", null, { value: name }));
  }
  const text = info.backbone.modality === "text";
  $("try-text-field").hidden = !text;
  $("try-file-field").hidden = text;
  $("try-reject").disabled = $("try-sets").disabled = !calibration;
  if (!calibration) { $("try-reject").checked = false; $("try-sets").value = ""; }
  $("access-state").textContent = info.server.token
    ? (token ? "A token is set; it is sent as an Authorization header."
      : "This server needs its token for the inbox, the versions and every change.")
    : "This server has no token.";
}

// ------------------------------------------------------------------------- try it
function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);  // a data: URL, base64
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function describeAnswer(answer, i) {
  const out = element("div");
  const ranked = answer.predictions[i];
  const unknown = answer.unknown ? answer.unknown[i] : null;
  const verdict = unknown === true
    ? element("p", `UNKNOWN: no known class fits this input (novelty `
      + `${answer.novelty[i].toFixed(3)} is below the threshold ${answer.threshold.toFixed(3)}); `
      + `the closest class is ${ranked[0].class}.`, { class: "unknown" })
    : element("p", `Answer: ${ranked[0].class}` + (unknown === false ? " (known)" : ""));
  out.append(verdict);
  const list = element("ol");
  for (const entry of ranked) {
    const probability = entry.probability === undefined ? "" :
      `probability ${entry.probability.toFixed(3)}, `;
    list.append(element("li", `${entry.class}: ${probability}score ${entry.score.toFixed(2)}`));
  }
  out.append(list);
  if (answer.sets) {
    out.append(element("p", `Conformal set: ${answer.sets[i].join(", ") || "(empty)"}`));
  }
  return out;
}

async function tryIt(event) {
  event.preventDefault();
  let input;
  if (info.backbone.modality === "text") {
    input = $("try-text").value;
  } else {
    const file = $("try-file").files[0];
    if (!file) { say("choose an image file first", true); return; }
    input = await readFile(file);
  }
  const request = { inputs: [input], top_k: Number($("try-top-k").value) || 1 };
  if ($("try-reject").checked) request.reject = true;
  if ($("try-sets").value.trim()) request.sets = Number($("try-sets").value);
  say("Predicting…");
  try {
    const answer = await api("POST", "/predict", request);
    const shown = $("answer");
    shown.replaceChildren(element("h3", `Answer of version ${answer.version}`));
    if (info.backbone.modality !== "text") {
      shown.append(element("img", null, { src: input, alt: "the image classified" }));
    }
    shown.append(describeAnswer(answer, 0));
    say(`Answered by version ${answer.version}.`);
    await refresh();
  } catch (error) {
    say(error.message, true);
  }
}

// ------------------------------------------------------------------------- the inbox
function preview(item) {
  if (typeof item.input !== "string") return element("blockquote", JSON.stringify(item.input));
  if (info.backbone.modality !== "image") return element("blockquote", item.input);
  const source = item.input.startsWith("data:") ? item.input
    : "data:image/png;base64," + item.input;
  return element("img", null, { src: source, alt: `the image of inbox item ${item.id}` });
}

function inboxItem(item) {
  const li = element("li", null, { "data-id": item.id });
  const first = item.answer.predictions[0];
  li.append(element("p", `Item ${item.id}, received `
    + `${new Date(item.received * 1000).toLocaleString()} and answered by ${item.version}: `
    + (item.answer.unknown ? `UNKNOWN (closest: ${first.class})` : first.class)
    + (first.probability === undefined ? "" : `, probability ${first.probability.toFixed(3)}`)));
  li.append(preview(item));
  li.append(element("p", `Label: ${item.label === null ? "none yet" : item.label}`,
                    { id: `label-state-${item.id}` }));
  const form = element("form");
  const field = `label-${item.id}`;
  form.append(element("label", `Class of item ${item.id} (known or new)`, { for: field }), " ",
              element("input", null, { id: field, list: "known-classes", autocomplete: "off",
                                       value: item.label || "" }), " ",
              element("button", "Label", { type: "submit", id: `save-${item.id}` }), " ",
              element("button", "Discard", { type: "button", id: `discard-${item.id}` }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    change(`labelling item ${item.id} as ${$(field).value.trim()}`, () => api("POST",
      `/inbox/${encodeURIComponent(item.id)}/label`, { label: $(field).value }));
  });
  form.querySelector(`#discard-${item.id}`).addEventListener("click", () =>
    change(`discarding item ${item.id}`, () => api("POST",
      `/inbox/${encodeURIComponent(item.id)}/discard`, {})));
  li.append(form);
  return li;
}

function showInbox(inbox) {
  const list = $("inbox-items");
  list.replaceChildren();
  if (inbox === null) {
    $("inbox-state").textContent = "This server keeps no inbox (start it with --inbox DIR).";
  } else {
    $("inbox-state").textContent = `${inbox.total} item${inbox.total === 1 ? "" : "s"}, `
      + `${inbox.labelled} labelled `
      + `(at most ${inbox.max_items} items and ${(inbox.max_bytes / 1048576).toFixed(1)} MiB; `
      + `${inbox.dropped} dropped to make room since the server started).`;
    for (const item of inbox.items) list.append(inboxItem(item));
  }
  const learnable = info.server.allow_learn && inbox !== null && inbox.labelled > 0;
  $("learn-labelled").disabled = !learnable;
  $("learn-state").textContent = !info.server.allow_learn
    ? "Learning is off on this server (start it with --allow-learn or --token-file)."
    : learnable ? `Learning makes one new version from the ${inbox.labelled} labelled items.`
      : "Label some items to learn them.";
}

// ------------------------------------------------------------------------- versions
function showVersions(listing) {
  const body = $("versions").tBodies[0];
  body.replaceChildren();
  for (const v of listing.versions) {
    const state = [v.current ? "current" : "", v.version === listing.serving ? "serving" : ""]
      .filter(Boolean).join(", ") || "kept";
    const events = (v.events || []).map((e) => e.action).join(", ");
    const row = element("tr");
    row.append(element("th", v.version, { scope: "row" }), element("td", state),
               element("td", v.created || "?"), element("td", v.classes ?? "?"),
               element("td", v.samples ?? "?"), element("td", v.problem || events || "saved"));
    const action = element("td");
    if (!v.current && info.server.allow_learn) {
      const button = element("button", `Roll back to ${v.version}`,
                             { type: "button", id: `rollback-${v.version}` });
      button.addEventListener("click", () => change(`rollback to ${v.version}`,
        () => api("POST", "/rollback", { version: v.version })));
      action.append(button);
    }
    row.append(action);
    body.append(row);
  }
}

// ------------------------------------------------------------------------- loading
async function optional(path) {
  try {
    return await api("GET", path);
  } catch (error) {
    if (error.status === 404) return null;
    throw error;
  }
}

async function refresh() {
  info = await api("GET", "/info");
  showModel();
  try {
    showInbox(await optional("/inbox"));
    showVersions(await api("GET", "/versions"));
  } catch (error) {
    if (error.status !== 401) throw error;
    showInbox(null);
    $("inbox-state").textContent = "Enter the server's token to see the inbox.";
    $("versions").tBodies[0].replaceChildren();
  }
}

async function change(what, call) {
  say(`Working: ${what}…`);
  try {
    const answer = await call();
    await refresh();
    say(answer && answer.version && answer.classes !== undefined
      ? `Done: ${what}; version ${answer.version} serves ${answer.classes} classes.`
      : `Done: ${what}.`);
  } catch (error) {
    say(error.message, true);
  }
}

function useToken(event) {
  event.preventDefault();
  token = $("token").value.trim();
  $("token").value = "";
  if ($("remember").checked && token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  change("using the token", async () => null);
}

function forgetToken() {
  token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  change("forgetting the token", async () => null);
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", useToken);
  $("forget-token").addEventListener("click", forgetToken);
  $("try-form").addEventListener("submit", tryIt);
  $("learn-labelled").addEventListener("click", () => change("learning the labelled items",
    () => api("POST", "/inbox/learn", {})));
  $("remember").checked = Boolean(token);
  refresh().then(() => say("Ready."), (error) => say(error.message, true));
});
