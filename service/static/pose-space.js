// The pose-space view: MNIST test digits' poses of one class's capsule, projected to 2-D by PCA.
//   GET /static/pose-space/{model}.json   points (label, predicted class, "not a digit" flag) and one projection per
//                                         class, written by `python -m training.predict.pose_space` from
//                                         capsnet-predict's Parquet output (docs/batch-predict.md)
//   GET /static/pose-space/{model}.png    the same digits as a sprite sheet
//   GET /static/pose-space/index.json     the models that have a projection (asked first: no 404 for the others)
// It follows the model chosen in #model-select. Hovering a point shows its digit; clicking sends the digit to the
// explorer as an upload (the `capsnet:image` event app.js listens to), which shows its reconstruction and sliders.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const SIZE = 320; // the plot's side in SVG units
  const MARGIN = 12;
  // ten colours told apart with common colour-vision deficiencies (Tableau 10)
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  const view = { model: null, data: null, sprite: null, loading: null, index: null };

  function projected() {
    view.index ??= fetch("/static/pose-space/index.json")
      .then((r) => (r.ok ? r.json() : { models: [] }))
      .then((index) => new Set(index.models))
      .catch(() => new Set());
    return view.index;
  }

  function notice(text) {
    const box = $("pose-space-notice");
    box.textContent = text;
    box.hidden = !text;
    $("pose-space-controls").hidden = Boolean(text);
  }

  async function load(model) {
    if (!model || model === view.model) return;
    view.model = model;
    view.data = null;
    const base = `/static/pose-space/${encodeURIComponent(model)}`;
    const loading = (view.loading = Symbol(model));
    let data = null;
    try {
      if ((await projected()).has(model)) {
        const response = await fetch(`${base}.json`);
        if (response.ok) data = await response.json();
      }
    } catch (_) {
      data = null;
    }
    if (view.loading !== loading) return; // another model was chosen meanwhile
    if (!data) {
      notice(
        `No pose-space projection for model “${model}”: make one with capsnet-predict --all-poses and ` +
          "python -m training.predict.pose_space (docs/batch-predict.md).",
      );
      return;
    }
    const sprite = new Image();
    sprite.src = `${base}.png`;
    await sprite.decode().catch(() => null);
    if (view.loading !== loading) return;
    view.data = data;
    view.sprite = sprite;
    notice("");
    fillClasses(data);
    render();
  }

  function fillClasses(data) {
    const select = $("pose-space-class");
    const previous = select.value;
    select.replaceChildren(...data.classes.map((label, c) => new Option(label, String(c))));
    if (previous && Number(previous) < data.classes.length) select.value = previous;
    const legend = $("pose-space-legend");
    legend.replaceChildren(
      ...data.classes.map((label, c) => legendItem(`predicted ${label}`, PALETTE[c % PALETTE.length])),
      legendItem("not a digit (ringed)", null),
    );
  }

  function legendItem(text, colour) {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = colour ? "swatch" : "swatch flagged-swatch";
    if (colour) swatch.style.background = colour; // CSSOM, which the Content-Security-Policy allows
    item.append(swatch, text);
    return item;
  }

  function scale(values) {
    const low = Math.min(...values);
    const high = Math.max(...values);
    const span = high - low || 1;
    return (v) => MARGIN + ((v - low) / span) * (SIZE - 2 * MARGIN);
  }

  function render() {
    const data = view.data;
    if (!data) return;
    const c = Number($("pose-space-class").value || 0);
    const projection = data.projections[c];
    const x = scale(projection.x);
    const y = scale(projection.y);
    const points = data.points;
    const plot = $("pose-space-plot");
    const circles = points.index.map((index, i) => {
      const dot = document.createElementNS(plot.namespaceURI, "circle");
      dot.setAttribute("cx", x(projection.x[i]).toFixed(1));
      dot.setAttribute("cy", (SIZE - y(projection.y[i])).toFixed(1));
      dot.setAttribute("r", "3.5");
      dot.setAttribute("fill", PALETTE[points.predicted_class[i] % PALETTE.length]);
      dot.dataset.point = String(i);
      if (points.in_distribution[i] === false) dot.classList.add("flagged");
      return dot;
    });
    // flagged points last, so that their rings are drawn on top
    circles.sort((a, b) => a.classList.contains("flagged") - b.classList.contains("flagged"));
    plot.replaceChildren(...circles);
    const [first, second] = projection.explained_variance.map((v) => `${Math.round(v * 100)}%`);
    $("pose-space-caption").textContent =
      `Capsule “${data.classes[c]}” of ${points.index.length} MNIST test digits (model ${data.model}, version ` +
      `${data.model_version}): its pose projected on its two principal components (${first} and ${second} ` +
      "of the variance). Hover a point to see the digit; click it to reconstruct it above.";
    hideTip();
  }

  function digitCanvas(i, side) {
    const data = view.data;
    const [h, w] = data.sprite.tile;
    const row = Math.floor(i / data.sprite.columns);
    const column = i % data.sprite.columns;
    const canvas = document.createElement("canvas");
    canvas.width = side;
    canvas.height = side;
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(view.sprite, column * w, row * h, w, h, 0, 0, side, side);
    return canvas;
  }

  function describe(i) {
    const p = view.data.points;
    const label = view.data.classes[p.predicted_class[i]];
    const flag = p.in_distribution[i] === false ? " · not a digit" : "";
    return `test image ${p.index[i]} · label ${p.label[i]} · predicted ${label}${flag}`;
  }

  function showTip(event) {
    const dot = event.target.closest("circle");
    if (!dot || !view.data) return;
    const i = Number(dot.dataset.point);
    const target = $("pose-space-digit");
    target.getContext("2d").drawImage(digitCanvas(i, target.width), 0, 0);
    $("pose-space-tip-text").textContent = describe(i);
    const tip = $("pose-space-tip");
    tip.dataset.point = String(i);
    tip.hidden = false;
  }

  function hideTip() {
    $("pose-space-tip").hidden = true;
  }

  function choose(event) {
    const dot = event.target.closest("circle");
    if (!dot || !view.data) return;
    const i = Number(dot.dataset.point);
    const name = `mnist-test-${view.data.points.index[i]}.png`;
    digitCanvas(i, view.data.sprite.tile[1]).toBlob((blob) => {
      if (blob) document.dispatchEvent(new CustomEvent("capsnet:image", { detail: { blob, name } }));
    }, "image/png");
    $("pose-space-chosen").textContent = `Sent ${describe(i)} to the explorer.`;
  }

  function init() {
    const select = $("model-select");
    const follow = () => load(select.value);
    select.addEventListener("change", follow);
    new MutationObserver(follow).observe(select, { childList: true, subtree: true, attributes: true });
    $("pose-space-class").addEventListener("change", render);
    const plot = $("pose-space-plot");
    plot.addEventListener("pointerover", showTip);
    plot.addEventListener("pointerleave", hideTip);
    plot.addEventListener("click", choose);
    follow();
  }

  init();
})();
