// mtserve's page: plain JavaScript, no build step, no external requests.
// Short texts go to POST /v1/translate; long ones to POST /v1/translate/stream, whose
// server-sent events fill the translation in sentence by sentence as they finish.
"use strict";

const $ = (id) => document.getElementById(id);
const STREAM_ABOVE_CHARS = 160; // longer texts (or several lines) are streamed
const KEY_STORAGE = "api_key"; // where LibreTranslate's page keeps the key, too
const state = {
  languages: [],
  settings: null,
  names: {},
  inFlight: null, // AbortController of the running text request
  generation: 0, // bumps with every request; late answers of older ones are ignored
  jobId: null, // the document job in progress (Cancel deletes it)
  resultName: "", // the translated document's file name
};

// With API keys on (frontend/settings says so) every request carries the key the user typed.
function authHeaders(headers = {}) {
  const key = $("api-key").value.trim();
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

async function getJSON(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

function option(value, label) {
  const element = document.createElement("option");
  element.value = value;
  element.textContent = label;
  return element;
}

function fillTargets() {
  const source = $("source-lang").value;
  const previous = $("target-lang").value;
  let targets;
  if (source === "auto") {
    targets = [...new Set(state.languages.flatMap((l) => l.targets))];
  } else {
    targets = (state.languages.find((l) => l.code === source) || { targets: [] }).targets;
  }
  const select = $("target-lang");
  select.replaceChildren(...targets.map((code) => option(code, state.names[code] || code)));
  if (targets.includes(previous)) select.value = previous;
  updateSwap();
}

function updateSwap() {
  const source = $("source-lang").value;
  const target = $("target-lang").value;
  const reverse = state.languages.find((l) => l.code === target);
  $("swap").disabled = source === "auto" || !reverse || !reverse.targets.includes(source);
}

function setStatus(text, isError = false) {
  const status = $("text-status");
  status.textContent = text;
  status.classList.toggle("error", isError);
}

function showLatency(ms, model, extra = "") {
  $("latency").textContent = `${Math.round(ms)} ms · model ${model}${extra}`;
}

function requestBody(text) {
  return {
    text,
    source_lang: $("source-lang").value,
    target_lang: $("target-lang").value,
    beam_size: Number($("beam-size").value),
  };
}

async function translateNow() {
  const text = $("source-text").value;
  $("char-count").textContent = state.settings && state.settings.charLimit > 0
    ? `${text.length} / ${state.settings.charLimit}` : `${text.length}`;
  if (state.inFlight) state.inFlight.abort();
  const generation = ++state.generation;
  if (!text.trim()) {
    $("target-text").value = "";
    setStatus("");
    return;
  }
  const controller = new AbortController();
  state.inFlight = controller;
  const started = performance.now();
  $("target-text").setAttribute("aria-busy", "true");
  setStatus("Translating…");
  try {
    if (text.length > STREAM_ABOVE_CHARS || text.includes("\n")) {
      await translateStreaming(text, controller, generation, started);
    } else {
      await translateOnce(text, controller, generation, started);
    }
  } catch (error) {
    if (error.name !== "AbortError" && generation === state.generation) {
      showFailure(error.message);
    }
  } finally {
    if (generation === state.generation) {
      $("target-text").setAttribute("aria-busy", "false");
      state.inFlight = null;
    }
  }
}

// A failed request leaves no translation on screen: the old one is not this text's answer.
function showFailure(message) {
  $("target-text").value = "";
  setStatus(message, true);
  if ($("source-text").value && !$("key-row").hidden && !$("api-key").value.trim()) {
    $("api-key").focus();
  }
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

async function translateOnce(text, controller, generation, started) {
  const response = await fetch("v1/translate", {
    method: "POST",
    headers: authHeaders({ "Content-Type": "application/json" }),
    body: JSON.stringify(requestBody(text)),
    signal: controller.signal,
  });
  if (!response.ok) throw new Error(await errorMessage(response));
  const body = await response.json();
  if (generation !== state.generation) return;
  $("target-text").value = body.translations[0].text;
  finish(body, started);
}

function finish(body, started) {
  const detected = $("source-lang").value === "auto" && body.source_lang
    ? ` · detected ${state.names[body.source_lang] || body.source_lang}` : "";
  setStatus(`Done${detected}`);
  showLatency(performance.now() - started, body.model, ` · server ${Math.round(body.time_ms)} ms`);
}

// Reads a text/event-stream response: calls onEvent(name, data) for each event.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

async function translateStreaming(text, controller, generation, started) {
  const response = await fetch("v1/translate/stream", {
    method: "POST",
    headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify(requestBody(text)),
    signal: controller.signal,
  });
  if (!response.ok) throw new Error(await errorMessage(response));
  const sentences = [];
  let failure = null;
  let firstAt = null;
  await readEvents(response, (name, data) => {
    if (generation !== state.generation || data === "[DONE]") return;
    const event = JSON.parse(data);
    if (name === "sentence") {
      if (firstAt === null) firstAt = performance.now() - started;
      sentences[event.index] = event.translation;
      $("target-text").value = sentences.filter((s) => s !== undefined).join(" ");
      setStatus(`${sentences.filter((s) => s !== undefined).length} of ${event.sentences} sentences`);
    } else if (name === "done") {
      $("target-text").value = event.translations[0].text;
      finish(event, started);
      $("latency").textContent += ` · first sentence ${Math.round(firstAt ?? 0)} ms`;
    } else if (name === "error") {
      failure = event.error;
    }
  });
  if (failure && generation === state.generation) showFailure(failure);
}

let debounceTimer = null;
function scheduleTranslation() {
  clearTimeout(debounceTimer);
  // The shown translation is stale from the first keystroke on: an answer still on its way
  // for the old text must not land after this.
  if (state.inFlight) state.inFlight.abort();
  state.generation++;
  setStatus("");
  const wait = state.settings ? state.settings.frontendTimeout : 500;
  debounceTimer = setTimeout(translateNow, wait);
}

function swapLanguages() {
  const source = $("source-lang").value;
  const target = $("target-lang").value;
  $("source-lang").value = target;
  fillTargets();
  $("target-lang").value = source;
  updateSwap();
  const translation = $("target-text").value;
  if (translation) $("source-text").value = translation;
  translateNow();
}

async function copyTranslation() {
  const text = $("target-text").value;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    $("target-text").select();
    document.execCommand("copy");
  }
  setStatus("Copied");
}

function selectTab(tab) {
  for (const other of document.querySelectorAll('[role="tab"]')) {
    const selected = other === tab;
    other.setAttribute("aria-selected", String(selected));
    other.tabIndex = selected ? 0 : -1;
    $(other.getAttribute("aria-controls")).hidden = !selected;
  }
  tab.focus();
}

function tabKeys(event) {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  const index = tabs.indexOf(event.target);
  if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
    const step = event.key === "ArrowRight" ? 1 : -1;
    selectTab(tabs[(index + step + tabs.length) % tabs.length]);
    event.preventDefault();
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function describeJob(name, job) {
  const counted = `${job.sentences_done} of ${job.sentences_total} sentences`;
  if (job.status === "queued") return `${name}: waiting for its turn…`;
  const left = job.seconds_left == null ? "" : `, about ${Math.ceil(job.seconds_left)} s left`;
  return `Translating ${name}: ${counted}${left}`;
}

// A document job (POST /v1/documents): the progress bar follows its status until it is done.
async function translateFile(event) {
  event.preventDefault();
  const file = $("file-input").files[0];
  if (!file) return;
  const form = new FormData();
  form.append("file", file);
  form.append("source_lang", $("source-lang").value);
  form.append("target_lang", $("target-lang").value);
  const status = $("file-status");
  const link = $("file-download");
  const progress = $("file-progress");
  link.hidden = true;
  status.classList.remove("error");
  status.textContent = `Uploading ${file.name}…`;
  progress.value = 0;
  progress.hidden = false;
  $("file-submit").disabled = true;
  const started = performance.now();
  try {
    const response = await fetch("v1/documents", {
      method: "POST", body: form, headers: authHeaders(),
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    let job = await response.json();
    state.jobId = job.id;
    $("file-cancel").hidden = false;
    $("file-cancel").disabled = false;
    while (job.status === "queued" || job.status === "translating") {
      progress.value = job.progress;
      status.textContent = describeJob(file.name, job);
      await sleep(300);
      const polled = await fetch(`v1/documents/${job.id}`, { headers: authHeaders() });
      if (!polled.ok) throw new Error(await errorMessage(polled));
      job = await polled.json();
    }
    if (job.status === "cancelled") {
      progress.hidden = true;
      status.textContent = `Cancelled ${file.name}.`;
      return;
    }
    if (job.status !== "done") throw new Error(job.error || `The translation was ${job.status}.`);
    progress.value = 1;
    link.href = job.result_url;
    state.resultName = job.filename;
    link.hidden = false;
    link.textContent = `Download ${job.filename}`;
    status.textContent = `Translated ${file.name} (${job.sentences_total} sentences) in ${Math.round(performance.now() - started)} ms`;
  } catch (error) {
    progress.hidden = true;
    status.textContent = error.message;
    status.classList.add("error");
  } finally {
    state.jobId = null;
    $("file-cancel").hidden = true;
    $("file-submit").disabled = false;
  }
}

// Cancel: DELETE on the job; the status poll then sees it cancelled and says so.
async function cancelFile() {
  if (!state.jobId) return;
  $("file-cancel").disabled = true;
  const response = await fetch(`v1/documents/${state.jobId}`, {
    method: "DELETE", headers: authHeaders(),
  });
  if (!response.ok) {
    $("file-status").textContent = await errorMessage(response);
    $("file-status").classList.add("error");
  }
}

// A plain link cannot send the key: with one, the file is fetched with it and saved.
async function downloadResult(event) {
  if (!$("api-key").value.trim()) return;
  event.preventDefault();
  const link = $("file-download");
  const response = await fetch(link.href, { headers: authHeaders() });
  if (!response.ok) {
    $("file-status").textContent = await errorMessage(response);
    $("file-status").classList.add("error");
    return;
  }
  const url = URL.createObjectURL(await response.blob());
  const save = document.createElement("a");
  save.href = url;
  save.download = state.resultName;
  document.body.append(save);
  save.click();
  save.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

function setUpKey(settings) {
  $("key-row").hidden = !settings.apiKeys;
  if (!settings.apiKeys) return;
  try { $("api-key").value = localStorage.getItem(KEY_STORAGE) || ""; } catch { /* private mode */ }
  $("api-key").addEventListener("input", () => {
    try { localStorage.setItem(KEY_STORAGE, $("api-key").value.trim()); } catch { /* private mode */ }
    scheduleTranslation();
  });
}

function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  const dark = theme ? theme === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
  $("theme-toggle").setAttribute("aria-pressed", String(dark));
  $("theme-toggle").textContent = dark ? "Light mode" : "Dark mode";
}

function toggleTheme() {
  const dark = $("theme-toggle").getAttribute("aria-pressed") === "true";
  const theme = dark ? "light" : "dark";
  try { localStorage.setItem("theme", theme); } catch { /* private mode */ }
  applyTheme(theme);
}

async function init() {
  let stored = null;
  try { stored = localStorage.getItem("theme"); } catch { /* private mode */ }
  applyTheme(stored);
  const [languages, settings, models] = await Promise.all([
    getJSON("languages"), getJSON("frontend/settings"), getJSON("v1/models"),
  ]);
  state.languages = languages;
  state.settings = settings;
  setUpKey(settings);
  for (const language of languages) state.names[language.code] = language.name;

  const sources = languages.filter((l) => l.targets.length);
  $("source-lang").replaceChildren(
    option("auto", "Detect language"),
    ...sources.map((l) => option(l.code, l.name)),
  );
  $("source-lang").value = sources.some((l) => l.code === settings.language.source.code)
    ? settings.language.source.code : "auto";
  fillTargets();
  if ([...$("target-lang").options].some((o) => o.value === settings.language.target.code)) {
    $("target-lang").value = settings.language.target.code;
  }
  const beams = [];
  for (let size = 1; size <= settings.maxBeamSize; size++) {
    beams.push(option(String(size), size === 1 ? "1 (greedy)" : String(size)));
  }
  $("beam-size").replaceChildren(...beams);
  $("beam-size").value = String(settings.defaultBeamSize);
  if (settings.charLimit > 0) $("source-text").maxLength = settings.charLimit;

  const formats = settings.supportedFilesFormat;
  $("file-formats").textContent = settings.filesTranslation
    ? `Supported: ${formats.join(", ")}` : "File translation is turned off on this server.";
  $("file-input").accept = formats.join(",");
  $("file-submit").disabled = !settings.filesTranslation;

  const cards = models.data.map((m) => `${m.id} (${m.source_lang}→${m.target_lang}, ${m.provider}${m.ready ? "" : ", loading"})`);
  $("model-info").textContent = `${cards.length === 1 ? "Model" : "Models"}: ${cards.join(", ")}`;

  $("source-text").addEventListener("input", scheduleTranslation);
  for (const id of ["source-lang", "target-lang", "beam-size"]) {
    $(id).addEventListener("change", () => {
      if (id === "source-lang") fillTargets();
      updateSwap();
      translateNow();
    });
  }
  $("swap").addEventListener("click", swapLanguages);
  $("copy").addEventListener("click", copyTranslation);
  $("clear").addEventListener("click", () => {
    $("source-text").value = "";
    translateNow();
    $("source-text").focus();
  });
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    tab.addEventListener("click", () => selectTab(tab));
    tab.addEventListener("keydown", tabKeys);
  }
  $("file-form").addEventListener("submit", translateFile);
  $("file-cancel").addEventListener("click", cancelFile);
  $("file-download").addEventListener("click", downloadResult);
  $("theme-toggle").addEventListener("click", toggleTheme);
  document.body.dataset.ready = "true";
}

init().catch((error) => {
  $("model-info").textContent = `Could not reach the service: ${error.message}`;
  $("model-info").classList.add("error");
});
