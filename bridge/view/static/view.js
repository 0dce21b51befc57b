// simbridge view: a live WebGL point-cloud viewer for the decimated clouds, no dependencies.
// Frames arrive on /ws in the layout of bridge/view/webframe.py:
//   "SBV1" | u32 header length H | H bytes JSON | f32 xyz*n | [f32 intensity*n] | [u8 rgba*n]
"use strict";

const canvas = document.getElementById("gl");
const gl = canvas.getContext("webgl", { antialias: false, preserveDrawingBuffer: true });
const clouds = new Map(); // topic -> {header, positions, intensity, rgba, lo, hi, at, count}
const hidden = new Set();
// Auto-fit: the camera frames every live cloud, re-fitting when one appears or grows out of
// view, until the user moves it (drag, pan, zoom); "fit view" frames again and resumes.
const state = { yaw: -0.6, pitch: 0.5, dist: 20, target: [0, 0, 0], auto: true, box: null };
const FOVY = 0.9;
// A stream with no new cloud fades after FADE_AFTER_S and is no longer drawn after
// STALE_AFTER_S (the panel shows 0 Hz by then; its row stays, greyed). ?stale_s=N overrides.
const params = new URLSearchParams(location.search);
const STALE_AFTER_S = Number(params.get("stale_s")) || 5;
const FADE_AFTER_S = 0.4 * STALE_AFTER_S;
// Below this size the status panel starts collapsed to one line (the toggle opens it).
const SMALL = { width: 1000, height: 700 };
// Exposed for tests and curious users: what has been drawn so far.
window.simbridgeView = { frames: 0, pointsDrawn: 0, topics: [], drawnTopics: [], staleTopics: [],
  staleAfterS: STALE_AFTER_S, camera: state };

// ---- shaders --------------------------------------------------------------------------------
const VS = `attribute vec3 pos; attribute vec3 col; uniform mat4 mvp; uniform float size;
varying vec3 vcol; void main() { gl_Position = mvp * vec4(pos, 1.0); gl_PointSize = size;
vcol = col; }`;
const FS = `precision mediump float; varying vec3 vcol; uniform float fade; uniform vec3 bg;
void main() { gl_FragColor = vec4(mix(bg, vcol, fade), 1.0); }`;

function shader(type, src) {
  const s = gl.createShader(type);
  gl.shaderSource(s, src);
  gl.compileShader(s);
  if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(s));
  return s;
}
const prog = gl.createProgram();
gl.attachShader(prog, shader(gl.VERTEX_SHADER, VS));
gl.attachShader(prog, shader(gl.FRAGMENT_SHADER, FS));
gl.linkProgram(prog);
const loc = {
  pos: gl.getAttribLocation(prog, "pos"), col: gl.getAttribLocation(prog, "col"),
  mvp: gl.getUniformLocation(prog, "mvp"), size: gl.getUniformLocation(prog, "size"),
  fade: gl.getUniformLocation(prog, "fade"), bg: gl.getUniformLocation(prog, "bg"),
};
const BG = [0.063, 0.078, 0.094];

// ---- small matrix helpers (column-major, like WebGL) ----------------------------------------
function perspective(fovy, aspect, near, far) {
  const f = 1 / Math.tan(fovy / 2), nf = 1 / (near - far);
  return [f / aspect, 0, 0, 0, 0, f, 0, 0, 0, 0, (far + near) * nf, -1, 0, 0, 2 * far * near * nf, 0];
}
function sub(a, b) { return [a[0] - b[0], a[1] - b[1], a[2] - b[2]]; }
function cross(a, b) { return [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]; }
function norm(a) { const l = Math.hypot(a[0], a[1], a[2]) || 1; return [a[0] / l, a[1] / l, a[2] / l]; }
function dot(a, b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
function lookAt(eye, center, up) {
  const z = norm(sub(eye, center)), x = norm(cross(up, z)), y = cross(z, x);
  return [x[0], y[0], z[0], 0, x[1], y[1], z[1], 0, x[2], y[2], z[2], 0,
    -dot(x, eye), -dot(y, eye), -dot(z, eye), 1];
}
function mul(a, b) {
  const o = new Array(16).fill(0);
  for (let c = 0; c < 4; c++) for (let r = 0; r < 4; r++)
    for (let k = 0; k < 4; k++) o[c * 4 + r] += a[k * 4 + r] * b[c * 4 + k];
  return o;
}
function eye() {
  const cp = Math.cos(state.pitch), t = state.target;
  return [t[0] + state.dist * cp * Math.cos(state.yaw), t[1] + state.dist * cp * Math.sin(state.yaw),
    t[2] + state.dist * Math.sin(state.pitch)];
}

// ---- colours ---------------------------------------------------------------------------------
function ramp(t) { // blue -> cyan -> green -> yellow -> red
  t = Math.min(1, Math.max(0, t));
  return [Math.min(1, Math.max(0, 1.5 - Math.abs(4 * t - 3))),
    Math.min(1, Math.max(0, 1.5 - Math.abs(4 * t - 2))),
    Math.min(1, Math.max(0, 1.5 - Math.abs(4 * t - 1)))];
}
function hashColor(s) {
  let h = 0;
  for (const ch of s) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return ramp((h % 1000) / 1000);
}
function colors(c, mode) {
  const n = c.header.n, out = new Float32Array(n * 3);
  if (mode === "auto") mode = c.rgba ? "rgb" : c.intensity ? "intensity" : "height";
  if (mode === "rgb" && c.rgba) {
    for (let i = 0; i < n; i++) for (let k = 0; k < 3; k++) out[i * 3 + k] = c.rgba[i * 4 + k] / 255;
  } else if (mode === "intensity" && c.intensity) {
    const lo = c.header.imin, span = (c.header.imax - lo) || 1;
    for (let i = 0; i < n; i++) out.set(ramp((c.intensity[i] - lo) / span), i * 3);
  } else if (mode === "stream") {
    const col = hashColor(c.header.topic);
    for (let i = 0; i < n; i++) out.set(col, i * 3);
  } else {
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < n; i++) { const z = c.positions[i * 3 + 2]; if (z < lo) lo = z; if (z > hi) hi = z; }
    const span = (hi - lo) || 1;
    for (let i = 0; i < n; i++) out.set(ramp((c.positions[i * 3 + 2] - lo) / span), i * 3);
  }
  return out;
}

// ---- frames ----------------------------------------------------------------------------------
function decode(buf) {
  const magic = new Uint8Array(buf, 0, 4);
  if (String.fromCharCode(...magic) !== "SBV1") return null;
  const hlen = new DataView(buf).getUint32(4, true);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, hlen)));
  let off = 8 + hlen;
  const n = header.n;
  const positions = new Float32Array(buf, off, n * 3); off += n * 12;
  let intensity = null, rgba = null;
  if (header.intensity) { intensity = new Float32Array(buf, off, n); off += n * 4; }
  if (header.rgb) { rgba = new Uint8Array(buf, off, n * 4); }
  return { header, positions, intensity, rgba };
}

function bounds(c) {
  const lo = [Infinity, Infinity, Infinity], hi = [-Infinity, -Infinity, -Infinity], p = c.positions;
  for (let i = 0; i < p.length; i += 3) for (let k = 0; k < 3; k++) {
    const v = p[i + k];
    if (!isFinite(v)) continue;
    if (v < lo[k]) lo[k] = v;
    if (v > hi[k]) hi[k] = v;
  }
  c.lo = lo; c.hi = hi;
}

function upload(c) {
  if (!c.pbuf) { c.pbuf = gl.createBuffer(); c.cbuf = gl.createBuffer(); }
  gl.bindBuffer(gl.ARRAY_BUFFER, c.pbuf);
  gl.bufferData(gl.ARRAY_BUFFER, c.positions, gl.DYNAMIC_DRAW);
  gl.bindBuffer(gl.ARRAY_BUFFER, c.cbuf);
  gl.bufferData(gl.ARRAY_BUFFER, colors(c, document.getElementById("color").value), gl.DYNAMIC_DRAW);
  c.count = c.header.n;
}

function ageS(c, now) { return (now - c.at) / 1000; }
function shown(topic, c, now) { return !hidden.has(topic) && ageS(c, now) < STALE_AFTER_S; }

// The box of every shown cloud; null when there is none.
function liveBox(now) {
  const lo = [Infinity, Infinity, Infinity], hi = [-Infinity, -Infinity, -Infinity];
  let any = false;
  for (const [topic, c] of clouds) {
    if (!shown(topic, c, now) || !(c.lo[0] <= c.hi[0])) continue;
    for (let k = 0; k < 3; k++) { lo[k] = Math.min(lo[k], c.lo[k]); hi[k] = Math.max(hi[k], c.hi[k]); }
    any = true;
  }
  return any ? { lo, hi } : null;
}

// Frame the box: its bounding sphere fits the narrower of the two fields of view, with margin.
function fit(box) {
  if (!box) return;
  const { lo, hi } = box;
  const aspect = canvas.clientWidth / Math.max(canvas.clientHeight, 1);
  const fov = Math.min(FOVY, 2 * Math.atan(Math.tan(FOVY / 2) * aspect));
  const radius = Math.max(0.5 * Math.hypot(hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]), 1e-3);
  state.target = [(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, (lo[2] + hi[2]) / 2];
  state.dist = 1.1 * radius / Math.sin(fov / 2);
  state.box = { lo: [...lo], hi: [...hi] };
}

// Auto-fit again when the shown clouds left the fitted box (by more than 10 % of its size).
function outgrown(box) {
  if (!box) return false;
  if (!state.box) return true;
  const size = Math.hypot(...state.box.hi.map((h, k) => h - state.box.lo[k])) || 1;
  for (let k = 0; k < 3; k++) {
    if (box.lo[k] < state.box.lo[k] - 0.1 * size || box.hi[k] > state.box.hi[k] + 0.1 * size) return true;
  }
  return false;
}

function onFrame(buf) {
  const f = decode(buf);
  if (!f) return;
  const topic = f.header.topic;
  const c = Object.assign(clouds.get(topic) || {}, f);
  c.at = performance.now();
  clouds.set(topic, c);
  bounds(c);
  upload(c);
  window.simbridgeView.frames++;
  window.simbridgeView.topics = [...clouds.keys()];
  if (state.auto) { const box = liveBox(c.at); if (outgrown(box)) fit(box); }
  draw();
}

// ---- drawing ---------------------------------------------------------------------------------
function draw() {
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
  gl.viewport(0, 0, w, h);
  gl.clearColor(BG[0], BG[1], BG[2], 1);
  gl.clear(gl.COLOR_BUFFER_BIT | gl.DEPTH_BUFFER_BIT);
  gl.enable(gl.DEPTH_TEST);
  gl.useProgram(prog);
  const mvp = mul(perspective(FOVY, w / Math.max(h, 1), state.dist / 1000, state.dist * 20),
    lookAt(eye(), state.target, [0, 0, 1]));
  gl.uniformMatrix4fv(loc.mvp, false, new Float32Array(mvp));
  gl.uniform1f(loc.size, Number(document.getElementById("size").value) * (window.devicePixelRatio || 1));
  gl.uniform3fv(loc.bg, BG);
  const now = performance.now(), drawnTopics = [], stale = [];
  let drawn = 0;
  for (const [topic, c] of clouds) {
    if (ageS(c, now) >= STALE_AFTER_S) stale.push(topic);
    if (!shown(topic, c, now) || !c.count) continue;
    const age = ageS(c, now);
    const fade = age <= FADE_AFTER_S ? 1 : 1 - 0.8 * (age - FADE_AFTER_S) / (STALE_AFTER_S - FADE_AFTER_S);
    gl.uniform1f(loc.fade, fade);
    drawnTopics.push(topic);
    gl.bindBuffer(gl.ARRAY_BUFFER, c.pbuf);
    gl.enableVertexAttribArray(loc.pos);
    gl.vertexAttribPointer(loc.pos, 3, gl.FLOAT, false, 0, 0);
    gl.bindBuffer(gl.ARRAY_BUFFER, c.cbuf);
    gl.enableVertexAttribArray(loc.col);
    gl.vertexAttribPointer(loc.col, 3, gl.FLOAT, false, 0, 0);
    gl.drawArrays(gl.POINTS, 0, c.count);
    drawn += c.count;
  }
  window.simbridgeView.pointsDrawn = drawn;
  window.simbridgeView.drawnTopics = drawnTopics;
  window.simbridgeView.staleTopics = stale;
}

// ---- interaction -----------------------------------------------------------------------------
let drag = null;
canvas.addEventListener("contextmenu", (e) => e.preventDefault());
canvas.addEventListener("mousedown", (e) => {
  drag = { x: e.clientX, y: e.clientY, pan: e.shiftKey || e.button === 2 };
  state.auto = false; // the user took the camera
});
window.addEventListener("mouseup", () => { drag = null; });
window.addEventListener("mousemove", (e) => {
  if (!drag) return;
  const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
  drag.x = e.clientX; drag.y = e.clientY;
  if (drag.pan) {
    const s = state.dist / canvas.clientHeight, rx = -Math.sin(state.yaw), ry = Math.cos(state.yaw);
    state.target = [state.target[0] - s * dx * rx, state.target[1] - s * dx * ry, state.target[2] + s * dy];
  } else {
    state.yaw -= dx * 0.005;
    state.pitch = Math.max(-1.55, Math.min(1.55, state.pitch + dy * 0.005));
  }
  draw();
});
canvas.addEventListener("wheel", (e) => {
  e.preventDefault();
  state.auto = false;
  state.dist *= Math.exp(e.deltaY * 0.001);
  draw();
}, { passive: false });
document.getElementById("fit").onclick = () => { state.auto = true; fit(liveBox(performance.now())); draw(); };
const panel = document.getElementById("panel"), toggle = document.getElementById("toggle");
function collapse(on) { panel.classList.toggle("collapsed", on); toggle.textContent = on ? "▸" : "▾"; }
toggle.onclick = () => collapse(!panel.classList.contains("collapsed"));
collapse(innerWidth < SMALL.width || innerHeight < SMALL.height);
setInterval(() => { if (clouds.size) draw(); }, 250); // fading and hiding need no new frame
document.getElementById("size").oninput = draw;
document.getElementById("color").onchange = () => { for (const c of clouds.values()) upload(c); draw(); };
window.addEventListener("resize", () => { if (state.auto) fit(liveBox(performance.now())); draw(); });

// ---- live connection and status ------------------------------------------------------------
function connect() {
  const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws");
  ws.binaryType = "arraybuffer";
  ws.onmessage = (e) => onFrame(e.data);
  ws.onclose = () => setTimeout(connect, 1000);
}

function cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; }

function renderStatus(st) {
  const b = st.bridge || {};
  const linked = (b.bridges || []).filter((r) => r.connected).length;
  document.getElementById("conn").innerHTML = (b.connected
    ? `<span class="ok">${linked > 1 ? linked + " bridges" : "bridge"} connected</span>`
    : '<span class="bad">no bridge connected</span>')
    + ` · frames ${b.frames_recorded ?? 0} · duplicates ${b.duplicates ?? 0}`;
  // One line per bridge: each numbers its frames (bridge_seq) on its own.
  const bridges = document.getElementById("bridges");
  bridges.textContent = "";
  for (const r of b.bridges || []) {
    const li = document.createElement("li");
    li.textContent = `${r.bridge_id || "(unnamed)"}: ${r.connected ? "connected" : "gone"}`
      + ` · acked bridge_seq ${r.acked_bridge_seq} · frames ${r.frames_received}`
      + ` · streams ${r.push_streams}`;
    bridges.appendChild(li);
  }
  const body = document.querySelector("#streams tbody");
  body.textContent = "";
  const now = performance.now();
  let live = 0, drops = 0;
  for (const s of st.streams) {
    const tr = document.createElement("tr");
    const c = clouds.get(s.topic);
    if (c && ageS(c, now) >= STALE_AFTER_S) tr.className = "stale";
    else if (s.rate_hz > 0) live++;
    drops += s.viewer_drops;
    const box = document.createElement("input");
    box.type = "checkbox"; box.checked = !hidden.has(s.topic);
    box.onchange = () => { box.checked ? hidden.delete(s.topic) : hidden.add(s.topic); draw(); };
    const td = document.createElement("td"); td.appendChild(box); tr.appendChild(td);
    tr.appendChild(cell(s.topic));
    tr.appendChild(cell(s.rate_hz.toFixed(1)));
    tr.appendChild(cell(s.kind === "point_cloud" ? `${s.points_in} → ${s.points_out}` : "telemetry"));
    tr.appendChild(cell(`${s.gaps} (${s.gap_frames} fr)`, s.gaps ? "bad" : ""));
    tr.appendChild(cell(String(s.viewer_drops), s.viewer_drops ? "bad" : ""));
    tr.appendChild(cell(s.latency_ms.toFixed(1)));
    tr.appendChild(cell(s.bridge_lag_ms.toFixed(1)));
    body.appendChild(tr);
  }
  const parts = [];
  if (st.mcap) parts.push(`MCAP: ${st.mcap.current || st.mcap.directory} (${st.mcap.files_written} files)`);
  if (st.foxglove) parts.push(`Foxglove: ws://${location.hostname}:${st.foxglove.port}`);
  if (st.web) parts.push(`viewers ${st.web.clients}`);
  document.getElementById("footer").textContent = parts.join(" · ");
  document.getElementById("summary").textContent = `${b.connected ? "bridge connected" : "no bridge"}`
    + ` · ${live}/${st.streams.length} streams live` + (drops ? ` · ${drops} viewer drops` : "");
}

async function pollStatus() {
  try {
    const r = await fetch("/api/status", { cache: "no-store" });
    renderStatus(await r.json());
  } catch (e) { document.getElementById("conn").textContent = "view unreachable"; }
  setTimeout(pollStatus, 1000);
}

connect();
pollStatus();
draw();
