// The capsule explorer: talks only to the service's public v1 API.
//   GET  /v1/models                      the served models (pose_shape, classes, has_decoder, versions)
//   POST /v1/models/{name}/capsules      lengths, poses and the 28×28 input the model received
//   POST /v1/models/{name}/decode        a reconstruction (PNG) from poses, edited by the sliders
//   POST /v1/models/{name}/explain       what a class rests on, by occlusion or the routing map (PNG overlay)
// Every POST names the picked version (`?version=`) when the user chose one; otherwise the newest answers.
// When the service answers 401 (CAPSNET_AUTH_TOKENS_FILE is set), the page asks for a bearer token.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const SLIDER_RANGE = 0.25; // the paper's Figure 4 range: each dimension moved by −0.25 … 0.25
  const SLIDER_STEP = 0.01;
  const INK_WIDTH = 20; // stroke width on the 280-pixel canvas: about 2 MNIST pixels
  // A transparent pixel: an image with nothing to show yet shows its black background, not a broken-image icon.
  const BLANK_IMAGE = "data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7";

  const state = {
    models: [],
    model: null, // a copy of the chosen entry of GET /v1/models, with `chosenVersion` ("" for the newest)
    source: null, // {kind: "canvas"} or {kind: "file", blob, name}
    result: null, // one entry of capsules[] from /capsules
    poseShape: null,
    reconClass: null,
    deltas: [], // per pose dimension, added to the pose of reconClass
    reconUrl: null,
    inputBlob: null, // the image last classified, sent again to /explain
    explainClass: null,
    explainMethod: null, // one of the model's explain_methods; the first (the service's default) until changed
    explainUrl: null,
  };

  // ---- talking to the service -------------------------------------------------------------------

  class ServiceError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, options = {}) {
    let response;
    for (;;) {
      const token = sessionStorage.getItem(TOKEN_KEY);
      try {
        response = await fetch(path, withToken(options, token));
      } catch (e) {
        throw new ServiceError(`Cannot reach the service (${e.message}).`, 0);
      }
      if (response.status !== 401) break;
      // Then the same request again, with the token (at once if another one was entered meanwhile).
      if (sessionStorage.getItem(TOKEN_KEY) === token) await askForToken(await errorMessage(response), token);
    }
    if (!response.ok) throw new ServiceError(await errorMessage(response), response.status);
    return response;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      if (body && typeof body.error === "string") return body.error;
    } catch (_) {
      // not JSON: the status text
    }
    return response.statusText || "request failed";
  }

  // ---- access token -----------------------------------------------------------------------------
  // Kept in sessionStorage: this tab only, gone when it closes; never in localStorage or a cookie.

  const TOKEN_KEY = "capsnet-serve.token";
  let tokenPrompt = null; // one prompt shared by every request that met a 401 meanwhile

  function withToken(options, token) {
    if (!token) return options;
    const headers = new Headers(options.headers);
    headers.set("Authorization", `Bearer ${token}`);
    return { ...options, headers };
  }

  // Show the token form with the service's reason (`rejected`: the token it refused); resolves once one is entered.
  function askForToken(reason, rejected) {
    if (tokenPrompt) return tokenPrompt;
    sessionStorage.removeItem(TOKEN_KEY);
    const form = $("token-form");
    const input = $("token-input");
    $("token-message").textContent = rejected
      ? `The service did not accept the token (${reason}). Enter another one.`
      : "This service needs an access token. Enter one to continue.";
    setStatus("");
    form.hidden = false;
    input.value = "";
    input.focus();
    tokenPrompt = new Promise((resolve) => {
      form.onsubmit = (event) => {
        event.preventDefault();
        const token = input.value;
        if (!token) return;
        sessionStorage.setItem(TOKEN_KEY, token);
        input.value = "";
        form.hidden = true;
        form.onsubmit = null;
        tokenPrompt = null;
        resolve();
      };
    });
    return tokenPrompt;
  }

  function modelPath(op, params = {}) {
    const query = new URLSearchParams(params);
    if (state.model.chosenVersion) query.set("version", state.model.chosenVersion);
    return `/v1/models/${encodeURIComponent(state.model.name)}/${op}?${query}`;
  }

  // Run `task` at most once at a time; calls while it runs coalesce into one more run, on the next frame.
  // While any task is queued or running, the results region is aria-busy.
  let running = 0;
  function setBusy(delta) {
    running += delta;
    $("results").setAttribute("aria-busy", String(running > 0));
  }

  function coalesce(task) {
    let busy = false;
    let pending = false;
    async function pump() {
      while (pending) {
        pending = false;
        try {
          await task();
        } catch (e) {
          showError(e);
        }
      }
      busy = false;
      setBusy(-1);
    }
    return () => {
      pending = true;
      if (!busy) {
        busy = true;
        setBusy(+1);
        requestAnimationFrame(pump);
      }
    };
  }

  // ---- messages ---------------------------------------------------------------------------------

  function showError(e) {
    const box = $("error");
    if (e instanceof ServiceError && e.status >= 400) {
      box.textContent = `The service rejected the input (HTTP ${e.status}): ${e.message}`;
    } else {
      box.textContent = e.message || String(e);
    }
    box.hidden = false;
    setStatus("");
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  function setStatus(text) {
    $("status").textContent = text;
  }

  // ---- models -----------------------------------------------------------------------------------

  async function loadModels() {
    let list;
    try {
      list = await (await api("/v1/models")).json();
    } catch (e) {
      showError(e);
      setTimeout(loadModels, 3000);
      return;
    }
    state.models = list.models;
    const ready = list.models.filter((m) => m.ready);
    if (ready.length === 0) {
      const loading = list.models.some((m) => m.state === "loading");
      setStatus(loading ? "The models are still loading…" : "No model is ready.");
      if (loading || list.models.length === 0) setTimeout(loadModels, 1000);
      fillModelSelect(list.models, null);
      return;
    }
    const preferred = ready.find((m) => m.name === list.default_model) || ready[0];
    fillModelSelect(list.models, preferred.name);
    chooseModel(preferred.name);
    setStatus("Draw a digit or upload an image.");
  }

  function fillModelSelect(models, selected) {
    const select = $("model-select");
    select.replaceChildren(
      ...models.map((m) => {
        const option = new Option(m.ready ? m.name : `${m.name} (${m.state}${m.error ? `: ${m.error}` : ""})`, m.name);
        option.disabled = !m.ready;
        option.selected = m.name === selected;
        return option;
      }),
    );
    select.disabled = models.filter((m) => m.ready).length < 2;
  }

  // The versions of the model: "newest" (the service's choice), then each loaded version; only ready ones
  // can be picked, and the picker is off while fewer than two are ready.
  function fillVersionSelect(m) {
    const select = $("version-select");
    const versions = m.versions || [];
    const ready = versions.filter((v) => v.ready);
    select.replaceChildren(
      new Option(ready.length ? `newest (${ready[0].version})` : "newest", ""),
      ...versions.map((v) => {
        const option = new Option(v.ready ? v.version : `${v.version} (${v.state}${v.error ? `: ${v.error}` : ""})`, v.version);
        option.disabled = !v.ready;
        return option;
      }),
    );
    select.value = m.chosenVersion;
    select.disabled = ready.length < 2;
  }

  function chooseModel(name, version = "") {
    const found = state.models.find((m) => m.name === name);
    state.model = found ? { ...found, chosenVersion: version } : null; // a new object: stale answers are dropped
    const m = state.model;
    if (!m) return;
    fillVersionSelect(m);
    const shape = m.pose_shape ? m.pose_shape.join("×") : "?";
    $("model-info").textContent =
      `${m.description || m.architecture || ""} · version ${m.chosenVersion || m.version}` +
      ` · architecture ${m.architecture} · pose ${shape}` +
      ` · decoder ${m.has_decoder ? "yes" : "no"} · ${m.execution_provider || ""}`;
    const noDecoder = $("no-decoder");
    noDecoder.hidden = m.has_decoder;
    noDecoder.textContent = m.has_decoder
      ? ""
      : `Model “${m.name}” has no decoder (its card's decoder is null), so it cannot reconstruct images: ` +
        "the reconstruction, the class picker and the pose sliders are turned off for it.";
    $("recon-controls").hidden = !m.has_decoder;
    $("recon-figure").hidden = !m.has_decoder;
    const noExplanation = $("no-explanation");
    noExplanation.hidden = canExplain(m);
    noExplanation.textContent = canExplain(m) ? "" : `Model “${m.name}” offers no explanation method.`;
    $("explain-controls").hidden = !canExplain(m);
    resetResults();
    if (state.source) requestClassify();
  }

  // ---- drawing and uploading --------------------------------------------------------------------

  const canvas = $("draw");
  const ctx = canvas.getContext("2d");
  let drawing = false;
  let inked = false;

  function clearCanvas() {
    ctx.fillStyle = "#000";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    inked = false;
  }

  function canvasPoint(event) {
    const rect = canvas.getBoundingClientRect();
    return {
      x: ((event.clientX - rect.left) * canvas.width) / rect.width,
      y: ((event.clientY - rect.top) * canvas.height) / rect.height,
    };
  }

  function startStroke(event) {
    if (event.button !== undefined && event.button > 0) return;
    event.preventDefault();
    canvas.setPointerCapture(event.pointerId);
    drawing = true;
    if (state.source && state.source.kind === "file") clearCanvas(); // a new drawing replaces an upload
    const p = canvasPoint(event);
    ctx.strokeStyle = "#fff";
    ctx.lineWidth = INK_WIDTH;
    ctx.lineCap = "round";
    ctx.lineJoin = "round";
    ctx.beginPath();
    ctx.moveTo(p.x, p.y);
    ctx.lineTo(p.x + 0.01, p.y);
    ctx.stroke();
    inked = true;
  }

  function continueStroke(event) {
    if (!drawing) return;
    event.preventDefault();
    const events = event.getCoalescedEvents ? event.getCoalescedEvents() : [event];
    for (const e of events.length ? events : [event]) {
      const p = canvasPoint(e);
      ctx.lineTo(p.x, p.y);
    }
    ctx.stroke();
    state.source = { kind: "canvas" };
    requestClassify();
  }

  function endStroke(event) {
    if (!drawing) return;
    drawing = false;
    if (canvas.hasPointerCapture(event.pointerId)) canvas.releasePointerCapture(event.pointerId);
    state.source = { kind: "canvas" };
    requestClassify();
  }

  function canvasBlob() {
    return new Promise((resolve, reject) =>
      canvas.toBlob((blob) => (blob ? resolve(blob) : reject(new Error("could not read the drawing"))), "image/png"),
    );
  }

  async function previewFile(file) {
    clearCanvas();
    try {
      const bitmap = await createImageBitmap(file);
      const scale = Math.min(canvas.width / bitmap.width, canvas.height / bitmap.height);
      const w = bitmap.width * scale;
      const h = bitmap.height * scale;
      ctx.drawImage(bitmap, (canvas.width - w) / 2, (canvas.height - h) / 2, w, h);
      bitmap.close();
    } catch (_) {
      // the browser cannot show it; the service decides whether it is an image
    }
  }

  function onFileChosen() {
    const input = $("file-input");
    const file = input.files && input.files[0];
    if (!file) return;
    state.source = { kind: "file", blob: file, name: file.name };
    previewFile(file);
    requestClassify();
  }

  // ---- classification ---------------------------------------------------------------------------

  async function classify() {
    const model = state.model;
    const source = state.source;
    if (!model || !source || (source.kind === "canvas" && !inked)) return;
    const form = new FormData();
    const blob = source.kind === "file" ? source.blob : await canvasBlob();
    const filename = source.kind === "file" ? source.name : "drawing.png";
    form.append("files", blob, filename);
    setStatus("Classifying…");
    let data;
    try {
      const params = { include_input: "true" };
      if (model.ood_calibrated) params.include_ood_parts = "true"; // the not-a-digit score's parts, shown in words
      data = await (await api(modelPath("capsules", params), { method: "POST", body: form })).json();
    } catch (e) {
      if (state.source === source) resetResults();
      throw e;
    }
    if (state.model !== model || !state.source) return; // model changed (a new run is queued) or cleared
    clearError();
    state.result = data.capsules[0];
    state.poseShape = data.pose_shape;
    state.inputBlob = { blob, filename };
    renderPrediction(model, state.result);
    renderHeatmap(state.result, state.poseShape);
    if (model.has_decoder) {
      state.reconClass = state.result.predicted_class;
      state.deltas = new Array(poseSize(state.poseShape)).fill(0);
      renderReconControls(model);
      requestDecode();
    }
    if (canExplain(model)) {
      state.explainClass = state.result.predicted_class;
      renderExplainControls(model);
      requestExplain();
    }
    setStatus(`Predicted class ${state.result.label}.`);
  }
  const requestClassify = coalesce(classify);

  function resetResults() {
    state.result = null;
    $("predicted-class").textContent = "–";
    $("input-info").textContent = "";
    $("lengths").replaceChildren();
    $("heatmap").replaceChildren();
    $("sliders").replaceChildren();
    $("recon-class").replaceChildren();
    $("recon-class").disabled = true;
    $("reset-button").disabled = true;
    $("sliders-fieldset").disabled = true;
    $("recon-caption").textContent = "";
    $("ood-info").textContent = "";
    $("ood-parts").replaceChildren();
    $("explain-class").replaceChildren();
    $("explain-class").disabled = true;
    $("explain-method").replaceChildren();
    $("explain-method").disabled = true;
    $("explain-meaning").textContent = "";
    $("explanation").src = BLANK_IMAGE;
    if (state.explainUrl) URL.revokeObjectURL(state.explainUrl);
    state.explainUrl = null;
    const input = $("model-input").getContext("2d");
    input.fillStyle = "#000";
    input.fillRect(0, 0, input.canvas.width, input.canvas.height);
    const img = $("reconstruction");
    img.src = BLANK_IMAGE;
    if (state.reconUrl) URL.revokeObjectURL(state.reconUrl);
    state.reconUrl = null;
  }

  // The score's parts that weigh most, as sentences ("the pose is unlike any 4 in training: ..."): why the flag.
  function oodReasons(parts) {
    return [...parts]
      .sort((a, b) => b.contribution - a.contribution)
      .slice(0, 3)
      .map((part) => {
        const li = document.createElement("li");
        li.textContent = part.says.charAt(0).toUpperCase() + part.says.slice(1) + ".";
        return li;
      });
  }

  function renderPrediction(model, result) {
    $("predicted-class").textContent = result.label;
    $("ood-info").textContent =
      result.in_distribution === null || result.in_distribution === undefined
        ? ""
        : result.in_distribution
          ? `Looks like a digit (not-a-digit score ${result.ood_score.toFixed(2)}).`
          : `This does not look like a digit (not-a-digit score ${result.ood_score.toFixed(2)}, above the ` +
            "model's calibrated threshold): the class above is a guess.";
    $("ood-parts").replaceChildren(...oodReasons(result.ood_parts || []));
    drawArray($("model-input"), result.preprocessing.input);
    const p = result.preprocessing;
    $("input-info").textContent = ` — ${p.inverted ? "inverted, " : ""}${p.normalized ? "MNIST-normalized" : "as sent"}`;
    const kind = result.score_kind === "activation" ? "activation" : "length";
    $("lengths-heading").textContent = kind === "length" ? "Capsule lengths" : "Capsule activations";
    $("lengths-hint").textContent =
      kind === "length"
        ? "The length of each class's capsule: the probability that the digit is present."
        : "The activation of each class's capsule (EM routing): the probability that the digit is present.";
    $("lengths").replaceChildren(
      ...result.scores.map((score, k) => {
        const li = document.createElement("li");
        li.className = k === result.predicted_class ? "top" : "";
        const label = document.createElement("span");
        label.className = "bar-label";
        label.textContent = model.classes ? model.classes[k] : String(k);
        const track = document.createElement("span");
        track.className = "bar-track";
        track.setAttribute("aria-hidden", "true");
        const bar = document.createElement("span");
        bar.className = "bar";
        bar.style.width = `${Math.max(0, Math.min(1, score)) * 100}%`;
        track.append(bar);
        const value = document.createElement("span");
        value.className = "bar-value";
        value.textContent = formatScore(score);
        li.append(label, track, value);
        li.setAttribute("aria-label", `class ${label.textContent}: ${kind} ${formatScore(score)}`);
        return li;
      }),
    );
  }

  // Three decimals, or two significant digits for scores too small to show that way (untrained models).
  function formatScore(v) {
    return v === 0 || Math.abs(v) >= 0.001 ? v.toFixed(3) : v.toExponential(1);
  }

  // A 2-D array of values in [0, 1] into a canvas of the same size (white digit on black).
  function drawArray(target, rows) {
    const h = rows.length;
    const w = rows[0].length;
    target.width = w;
    target.height = h;
    const g = target.getContext("2d");
    const image = g.createImageData(w, h);
    rows.forEach((row, y) =>
      row.forEach((v, x) => {
        const c = Math.round(Math.max(0, Math.min(1, v)) * 255);
        image.data.set([c, c, c, 255], (y * w + x) * 4);
      }),
    );
    g.putImageData(image, 0, 0);
  }

  // ---- pose heatmap -----------------------------------------------------------------------------

  function poseSize(shape) {
    return shape.reduce((a, b) => a * b, 1);
  }

  function flat(nested) {
    return Array.isArray(nested) ? nested.flat(Infinity) : [nested];
  }

  // Flat values back into `shape` (e.g. [16] or [4, 4]).
  function unflatten(values, shape) {
    if (shape.length <= 1) return values.slice();
    const step = poseSize(shape.slice(1));
    const out = [];
    for (let i = 0; i < shape[0]; i++) out.push(unflatten(values.slice(i * step, (i + 1) * step), shape.slice(1)));
    return out;
  }

  function colour(v, scale) {
    const t = scale > 0 ? Math.max(-1, Math.min(1, v / scale)) : 0;
    const [r, g, b] = t >= 0 ? [178, 24, 43] : [33, 102, 172]; // red positive, blue negative
    const a = Math.abs(t);
    const mix = (c) => Math.round(255 + (c - 255) * a);
    return `rgb(${mix(r)}, ${mix(g)}, ${mix(b)})`;
  }

  // One row per class: a strip of P cells for a vector pose, an R×C block for a matrix pose (EM: 4×4).
  function renderHeatmap(result, shape) {
    const rows = result.poses.map(flat);
    const scale = Math.max(1e-9, ...rows.flat().map(Math.abs));
    const cols = shape[shape.length - 1];
    const blockRows = poseSize(shape) / cols;
    const map = $("heatmap");
    map.className = blockRows > 1 ? "heatmap blocks" : "heatmap strips";
    map.style.setProperty("--cols", String(cols));
    map.setAttribute(
      "aria-label",
      `Pose heatmap: ${rows.length} classes × ${shape.join("×")}; the largest absolute value is ${scale.toFixed(3)}`,
    );
    map.replaceChildren(
      ...rows.map((values, k) => {
        const row = document.createElement("div");
        row.className = k === result.predicted_class ? "pose-row top" : "pose-row";
        const label = document.createElement("span");
        label.className = "pose-label";
        label.textContent = state.model && state.model.classes ? state.model.classes[k] : String(k);
        const cells = document.createElement("div");
        cells.className = "pose-cells";
        values.forEach((v, d) => {
          const cell = document.createElement("span");
          cell.className = "cell";
          cell.style.background = colour(v, scale);
          cell.title = `class ${label.textContent}, dimension ${d + 1}: ${v.toFixed(3)}`;
          cells.append(cell);
        });
        row.append(label, cells);
        return row;
      }),
    );
  }

  // ---- reconstruction ---------------------------------------------------------------------------

  function renderReconControls(model) {
    const select = $("recon-class");
    const classes = model.classes || state.result.scores.map((_, k) => String(k));
    select.replaceChildren(
      ...classes.map((label, k) => {
        const predicted = k === state.result.predicted_class;
        const option = new Option(predicted ? `${label} (predicted)` : label, String(k));
        option.selected = k === state.reconClass;
        return option;
      }),
    );
    select.disabled = false;
    $("reset-button").disabled = false;
    renderSliders();
  }

  function renderSliders() {
    const base = flat(state.result.poses[state.reconClass]);
    const label = state.model.classes ? state.model.classes[state.reconClass] : String(state.reconClass);
    $("sliders-legend").textContent = `Pose dimensions of capsule “${label}” (${base.length})`;
    $("sliders-fieldset").disabled = false;
    $("sliders").replaceChildren(
      ...base.map((value, d) => {
        const wrap = document.createElement("div");
        wrap.className = "slider";
        const id = `dim-${d}`;
        const name = document.createElement("label");
        name.htmlFor = id;
        name.textContent = `Dimension ${d + 1}`;
        const input = document.createElement("input");
        input.type = "range";
        input.id = id;
        input.min = String(-SLIDER_RANGE);
        input.max = String(SLIDER_RANGE);
        input.step = String(SLIDER_STEP);
        input.value = String(state.deltas[d]);
        input.dataset.dim = String(d);
        const out = document.createElement("output");
        out.htmlFor = id;
        const show = () => {
          const delta = state.deltas[d];
          const text = `${delta >= 0 ? "+" : "−"}${Math.abs(delta).toFixed(2)}`;
          out.textContent = text;
          input.setAttribute("aria-valuetext", `${text}, pose value ${(value + delta).toFixed(3)}`);
        };
        input.addEventListener("input", () => {
          state.deltas[d] = Number(input.value);
          show();
          requestDecode();
        });
        show();
        wrap.append(name, input, out);
        return wrap;
      }),
    );
  }

  // Every class's pose, with the slider offsets added to the capsule being decoded.
  function editedPoses() {
    return state.result.poses.map((pose, k) => {
      const values = flat(pose);
      if (k !== state.reconClass) return pose;
      return unflatten(
        values.map((v, d) => v + state.deltas[d]),
        state.poseShape,
      );
    });
  }

  async function decode() {
    const model = state.model;
    if (!model || !model.has_decoder || !state.result) return;
    const cls = state.reconClass;
    const response = await api(modelPath("decode", { format: "png" }), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ poses: editedPoses(), class: cls }),
    });
    const blob = await response.blob();
    if (state.model !== model || !state.result) return;
    const url = URL.createObjectURL(blob);
    const img = $("reconstruction");
    await new Promise((resolve) => {
      img.onload = img.onerror = resolve;
      img.src = url;
    });
    if (state.reconUrl) URL.revokeObjectURL(state.reconUrl);
    state.reconUrl = url;
    const label = model.classes ? model.classes[cls] : String(cls);
    const edited = state.deltas.some((d) => d !== 0);
    $("recon-caption").textContent = `from capsule “${label}”${edited ? " (edited pose)" : ""}`;
    img.alt = `Reconstruction from the capsule of class ${label}${edited ? " with an edited pose" : ""}`;
  }
  const requestDecode = coalesce(decode);

  function onReconClass() {
    state.reconClass = Number($("recon-class").value);
    state.deltas = state.deltas.map(() => 0);
    renderSliders();
    requestDecode();
  }

  function resetSliders() {
    state.deltas = state.deltas.map(() => 0);
    renderSliders();
    requestDecode();
  }

  // ---- explanation ------------------------------------------------------------------------------

  // Mean class score on 1,000 MNIST test digits, intact and with 10% of the ink removed: the 10% the method ranks
  // highest, or a random 10%. From docs/results/explanations/faithfulness.json (python -m training.report.faithfulness).
  const FAITHFULNESS = {
    // faithfulness:begin
    "capsnet-mnist": { base: 0.9, occlusion: 0.45, routing: 0.84, random: 0.85 },
    "capsnet-mnist-int8": { base: 0.89, occlusion: 0.44, routing: 0.84, random: 0.85 },
    "capsnet-em-mnist": { base: 0.98, occlusion: 0.69, random: 0.96 },
    // faithfulness:end
  };
  const METHOD_NAMES = { occlusion: "Occlusion", routing: "Routing map" };
  const METHOD_MEANINGS = {
    occlusion:
      "Red marks the 4×4 tiles whose blacking-out lowers the class score most: the ink the model needs for this class.",
    routing:
      "Red marks where the primary capsules sent their votes for the class; it is not what the score depends on.",
  };

  function canExplain(model) {
    return Boolean(model.explain_methods && model.explain_methods.length);
  }

  function faithfulness(model, method) {
    const m = FAITHFULNESS[model.name];
    if (!m || m[method] === undefined) return "Its faithfulness has not been measured for this model.";
    const drop = (m.base - m[method]) / Math.max(m.base - m.random, 1e-9);
    return (
      `Measured on 1,000 test digits: removing the 10% of the ink it ranks highest takes the score from ` +
      `${m.base.toFixed(2)} to ${m[method].toFixed(2)}, against ${m.random.toFixed(2)} for a random 10% ` +
      `(${drop.toFixed(drop < 10 ? 1 : 0)}× the drop).`
    );
  }

  function renderExplainControls(model) {
    const select = $("explain-class");
    const classes = model.classes || state.result.scores.map((_, k) => String(k));
    select.replaceChildren(
      ...classes.map((label, k) => {
        const predicted = k === state.result.predicted_class;
        const option = new Option(predicted ? `${label} (predicted)` : label, String(k));
        option.selected = k === state.explainClass;
        return option;
      }),
    );
    select.disabled = false;
    const methods = model.explain_methods;
    if (!methods.includes(state.explainMethod)) state.explainMethod = methods[0];
    const methodSelect = $("explain-method");
    methodSelect.replaceChildren(
      ...methods.map((m, i) => {
        const option = new Option(`${METHOD_NAMES[m] || m}${i === 0 ? " (default)" : ""}`, m);
        option.selected = m === state.explainMethod;
        return option;
      }),
    );
    methodSelect.disabled = methods.length < 2;
  }

  async function explain() {
    const model = state.model;
    if (!model || !canExplain(model) || !state.inputBlob) return;
    const cls = state.explainClass;
    const method = state.explainMethod;
    const form = new FormData();
    form.append("files", state.inputBlob.blob, state.inputBlob.filename);
    const query = { format: "png", scale: "8", class: String(cls), method };
    const response = await api(modelPath("explain", query), { method: "POST", body: form });
    const blob = await response.blob();
    if (state.model !== model || !state.result || state.explainMethod !== method) return;
    const url = URL.createObjectURL(blob);
    const img = $("explanation");
    await new Promise((resolve) => {
      img.onload = img.onerror = resolve;
      img.src = url;
    });
    if (state.explainUrl) URL.revokeObjectURL(state.explainUrl);
    state.explainUrl = url;
    const label = model.classes ? model.classes[cls] : String(cls);
    const name = METHOD_NAMES[method] || method;
    img.alt = `${name} map for class ${label} over the model input`;
    $("explain-caption").textContent = `${name} for “${label}” (red: more)`;
    $("explain-meaning").textContent = `${METHOD_MEANINGS[method] || ""} ${faithfulness(model, method)}`.trim();
  }
  const requestExplain = coalesce(explain);

  function onExplainClass() {
    state.explainClass = Number($("explain-class").value);
    requestExplain();
  }

  // ---- images sent by other views (pose-space.js) ----------------------------------------------------

  function onImageEvent(event) {
    const { blob, name } = event.detail;
    state.source = { kind: "file", blob, name };
    $("file-input").value = "";
    previewFile(blob);
    requestClassify();
  }

  function onExplainMethod() {
    state.explainMethod = $("explain-method").value;
    requestExplain();
  }

  // ---- wiring -----------------------------------------------------------------------------------

  function init() {
    clearCanvas();
    resetResults();
    canvas.addEventListener("pointerdown", startStroke);
    canvas.addEventListener("pointermove", continueStroke);
    canvas.addEventListener("pointerup", endStroke);
    canvas.addEventListener("pointercancel", endStroke);
    $("clear-button").addEventListener("click", () => {
      clearCanvas();
      state.source = null;
      $("file-input").value = "";
      clearError();
      resetResults();
      setStatus("Cleared. Draw a digit or upload an image.");
    });
    $("file-input").addEventListener("change", onFileChosen);
    $("model-select").addEventListener("change", (e) => chooseModel(e.target.value));
    $("version-select").addEventListener("change", (e) => chooseModel(state.model.name, e.target.value));
    $("recon-class").addEventListener("change", onReconClass);
    $("reset-button").addEventListener("click", resetSliders);
    $("explain-class").addEventListener("change", onExplainClass);
    document.addEventListener("capsnet:image", onImageEvent);
    $("explain-method").addEventListener("change", onExplainMethod);
    loadModels();
  }

  init();
})();
