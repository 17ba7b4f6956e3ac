// The run report's script (condense/report.py inlines it into every report.html): draws the
// circuit from the page's inline JSON, hover cards, lit paths, the edge-count selector.
(function () {
  const errors = document.getElementById("errors");
  window.addEventListener("error", e => { errors.textContent += "error: " + e.message + "\n"; });
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const c = data.circuit;
  const svg = document.getElementById("circuit");
  if (!c || !svg) return;
  const NS = "http://www.w3.org/2000/svg";
  const colours = data.colours, tip = document.getElementById("tip");
  const L = c.cfg.n_layers || 1, H = c.cfg.n_heads || 1;
  const colW = Math.max(46, Math.min(90, 900 / (H + 1))), rowH = 26, left = 60, bottom = 30;
  const W = left + (H + 1) * colW + 40, rows = 2 * L + 2, Ht = rows * rowH + bottom + 10;
  svg.setAttribute("width", W); svg.setAttribute("height", Ht);
  svg.setAttribute("viewBox", "0 0 " + W + " " + Ht);
  // where a node sits: input row 0, layer l's heads row 2l+1, its MLP row 2l+2, logits on top
  function place(name) {
    let m;
    if (name === "input") return [left + H * colW / 2, Ht - bottom];
    if (name === "logits") return [left + H * colW / 2, Ht - bottom - (rows - 1) * rowH];
    if ((m = /^a(\d+)\.h(\d+)$/.exec(name))) return [left + (+m[2]) * colW + colW / 2, Ht - bottom - (2 * m[1] + 1) * rowH];
    if ((m = /^m(\d+)$/.exec(name))) return [left + H * colW + colW / 2, Ht - bottom - (2 * m[1] + 2) * rowH];
    if ((m = /^m(\d+)\.n(\d+)$/.exec(name))) return [left + H * colW + colW / 2, Ht - bottom - (2 * m[1] + 2) * rowH];
    return [left, Ht - bottom];
  }
  const KOFF = {q: -9, k: 0, v: 9, "": 0};
  const onNodes = new Set(c.nodes);
  const edgeLayer = document.createElementNS(NS, "g"), nodeLayer = document.createElementNS(NS, "g");
  edgeLayer.setAttribute("id", "edges"); nodeLayer.setAttribute("id", "nodes");
  svg.appendChild(edgeLayer); svg.appendChild(nodeLayer);
  for (let l = 0; l < L; l++) {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", 6); t.setAttribute("y", Ht - bottom - (2 * l + 1) * rowH + 4);
    t.setAttribute("class", "layer-label"); t.setAttribute("font-size", "10"); t.textContent = "layer " + l;
    svg.insertBefore(t, edgeLayer);
  }
  const all = ["input", "logits"];
  for (let l = 0; l < L; l++) { for (let h = 0; h < H; h++) all.push("a" + l + ".h" + h); all.push("m" + l); }
  for (const n of c.nodes) if (!all.includes(n)) all.push(n);
  const nodeEls = {};
  for (const name of all) {
    const [x, y] = place(name), g = document.createElementNS(NS, "g");
    const on = onNodes.has(name);
    g.setAttribute("class", "node " + (on ? "on" : "off")); g.dataset.name = name;
    let shape;
    if (name.startsWith("m") || name === "input" || name === "logits") {
      shape = document.createElementNS(NS, "rect");
      const w = name.startsWith("m") ? 30 : 60;
      shape.setAttribute("x", x - w / 2); shape.setAttribute("y", y - 8);
      shape.setAttribute("width", w); shape.setAttribute("height", 16); shape.setAttribute("rx", 3);
    } else {
      shape = document.createElementNS(NS, "circle");
      shape.setAttribute("cx", x); shape.setAttribute("cy", y); shape.setAttribute("r", 8);
    }
    g.appendChild(shape);
    if (on) {
      const t = document.createElementNS(NS, "text");
      t.setAttribute("x", x); t.setAttribute("y", y + 3); t.setAttribute("text-anchor", "middle");
      t.textContent = name === "input" || name === "logits" ? name : name.replace(/^a\d+\./, "");
      g.appendChild(t);
    }
    nodeLayer.appendChild(g); nodeEls[name] = g;
  }
  const maxScore = Math.max(1e-12, ...c.edges.map(e => Math.abs(e[3] || 0)));
  let shown = [];
  function draw(limit) {
    const begin = performance.now();
    edgeLayer.textContent = "";
    shown = c.edges.slice(0, limit);
    const frag = document.createDocumentFragment();
    shown.forEach((e, i) => {
      const [s, r, kind, score] = e, [x1, y1] = place(s), [x2, y2] = place(r);
      const line = document.createElementNS(NS, "line");
      line.setAttribute("x1", x1); line.setAttribute("y1", y1 - 8);
      line.setAttribute("x2", x2 + (KOFF[kind] || 0)); line.setAttribute("y2", y2 + 8);
      line.setAttribute("stroke", colours[kind] || colours[""]);
      line.setAttribute("stroke-width", (0.6 + 4.4 * Math.abs(score || 0) / maxScore).toFixed(2));
      line.setAttribute("class", "edge"); line.dataset.index = i;
      frag.appendChild(line);
    });
    edgeLayer.appendChild(frag);
    document.getElementById("edge-count").textContent =
      "showing " + shown.length.toLocaleString("en") + " of " + c.edges.length.toLocaleString("en") + " edges";
    svg.dataset.shownEdges = shown.length;
    svg.dataset.drawMs = (performance.now() - begin).toFixed(1);
  }
  function show(ev, text) {
    tip.textContent = text; tip.style.display = "block";
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 440) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  }
  svg.addEventListener("mousemove", ev => {
    const t = ev.target;
    if (t.classList && t.classList.contains("edge")) {
      const [s, r, kind, score] = shown[+t.dataset.index];
      const name = s + "->" + r + (kind ? "<" + kind + ">" : "");
      const partners = (data.partners || {})[name];
      let text = name + "\nscore " + (score === null ? "–" : (+score).toPrecision(4)) +
        (kind ? "\nreceiver input: " + kind : "");
      if (partners !== undefined) {
        text += "\ninteracts with " + partners.length + " other edges (verify)";
        for (const p of partners.slice(0, 8)) text += "\n  " + p;
        if (partners.length > 8) text += "\n  …";
      }
      show(ev, text);
    } else if (t.closest && t.closest(".node")) {
      const name = t.closest(".node").dataset.name;
      const lines = [name];
      if (data.roles[name]) lines.push("role: " + data.roles[name]);
      const nr = (c.neuron_roles || {})[name];
      if (nr) lines.push("neurons: " + Object.entries(nr).map(([r, k]) => k + " " + r).join(", "));
      for (const l of data.cards[name] || []) lines.push(l);
      if (!onNodes.has(name)) lines.push("(not in the circuit)");
      show(ev, lines.join("\n"));
    } else tip.style.display = "none";
  });
  svg.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  // a click on a node lights its paths down to input and up to logits, among the shown edges
  let focused = null;
  function focusNode(name) {
    svg.querySelectorAll(".lit").forEach(x => x.classList.remove("lit"));
    focused = name && onNodes.has(name) ? name : null;
    svg.dataset.focus = focused || "";
    if (!focused) { svg.classList.remove("focus"); return; }
    const up = {}, down = {};
    shown.forEach((e, i) => { (down[e[1]] = down[e[1]] || []).push([e[0], i]); (up[e[0]] = up[e[0]] || []).push([e[1], i]); });
    const lit = new Set([focused]), edgesLit = new Set();
    for (const graph of [down, up]) {
      const stack = [focused], seen = new Set([focused]);
      while (stack.length) {
        const n = stack.pop();
        for (const [m, i] of graph[n] || []) { edgesLit.add(i); lit.add(m); if (!seen.has(m)) { seen.add(m); stack.push(m); } }
      }
    }
    svg.classList.add("focus");
    lit.forEach(n => nodeEls[n] && nodeEls[n].classList.add("lit"));
    edgeLayer.querySelectorAll("line.edge").forEach(l => { if (edgesLit.has(+l.dataset.index)) l.classList.add("lit"); });
  }
  svg.addEventListener("click", ev => {
    const g = ev.target.closest && ev.target.closest(".node");
    focusNode(g ? g.dataset.name : null);
  });
  const select = document.getElementById("edge-limit");
  const wanted = /edges=(all|\d+)/.exec(location.hash + location.search);
  let limit = wanted ? (wanted[1] === "all" ? c.edges.length : +wanted[1]) : data.shown;
  if (![...select.options].some(o => +o.value === limit)) {
    const o = document.createElement("option"); o.value = limit; o.textContent = limit.toLocaleString("en"); select.appendChild(o);
  }
  select.value = String(limit);
  select.addEventListener("change", () => { draw(+select.value); focusNode(focused); });
  draw(limit);
  const node = /node=([^&]+)/.exec(location.hash);  // a link to a node: report.html#node=a9.h6
  if (node) focusNode(decodeURIComponent(node[1]));
  document.body.dataset.ready = "1";
})();
