// Facecast web client: no build step. Connects over WebRTC, sends the microphone, shows
// the avatar, keeps live stats in window.facecastStats (read by tests and dashboards).
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const stats = (window.facecastStats = {
  state: "idle", ttffMs: null, framesDecoded: 0, fps: 0, freezeCount: 0,
  rttMs: null, kbps: null, speaking: false, error: null, sessionId: null, statsAtMs: null,
  // the server's own counters, from its `stats` events (once a second)
  freshShare: null, speechToLipsMs: null, playoutDelayMs: null, engineFps: null,
  belowRealTime: false,
});

let pc = null, channel = null, micStream = null, sessionId = null;
let statsTimer = null, connectStart = 0, lastBytes = 0, lastTs = 0, lastFrames = 0;

// level: "info", "warn" (may heal by itself) or "error" (kept in facecastStats.error)
function say(text, level = "info") {
  $("message").textContent = text;
  $("message").classList.toggle("error", level !== "info");
  if (level === "error") stats.error = text;
}

function setState(state) {
  stats.state = state;
  const live = state === "connecting" || state === "connected";
  $("connect").disabled = live;
  $("disconnect").disabled = !live;
  $("mic").disabled = state !== "connected";
  $("interrupt").disabled = state !== "connected";
  render();
}

function render() {
  for (const dd of document.querySelectorAll("#stats dd")) {
    const v = stats[dd.dataset.k];
    dd.textContent = v === null || v === undefined ? "–" : String(v);
  }
}

function logEvent(msg) {
  const li = document.createElement("li");
  li.textContent = JSON.stringify(msg);
  $("events").prepend(li);
  while ($("events").children.length > 50) $("events").lastChild.remove();
}

// The token travels in the Authorization header only. A link may carry ?token= for
// convenience: it moves into the field and out of the address bar at once, so it is not
// kept in history, bookmarks or Referer headers (the server redacts it from its log).
if (params.has("token")) {
  $("token").value = params.get("token");
  params.delete("token");
  const query = params.toString();
  history.replaceState(null, "", location.pathname + (query ? "?" + query : "") + location.hash);
}

function token() {
  return $("token").value;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (token()) h.Authorization = "Bearer " + token();
  return h;
}

// The session's own photo (optional): checked here for type and size, then by the server
// (one frontal face, big enough), before the call starts. Where the server finds no face
// (or the wrong one), the user frames it by hand: the photo is shown, a box is dragged
// around the face (and tilted with the head), and the upload carries it
// (POST /photos?face_box=X,Y,W,H[,ANGLE], in the photo's own pixels, ANGLE in degrees
// clockwise).
const PHOTO_TYPES = ["image/png", "image/jpeg", "image/webp"];
const PHOTO_MAX_BYTES = 16 * 1024 * 1024;

async function uploadPhoto() {
  const file = $("photo").files[0];
  if (!file) return { ok: true, id: null };
  if (!PHOTO_TYPES.includes(file.type)) {
    return { ok: false, reason: "the photo must be a PNG, JPEG or WebP image (got " + (file.type || "an unknown type") + ")" };
  }
  if (file.size > PHOTO_MAX_BYTES) {
    return { ok: false, reason: "the photo is " + (file.size / 1048576).toFixed(1) + " MiB; the limit is 16 MiB" };
  }
  const h = { "Content-Type": file.type };
  if (token()) h.Authorization = "Bearer " + token();
  const box = framer.box && (framer.box[4] ? framer.box : framer.box.slice(0, 4));
  const url = box ? "/photos?face_box=" + box.map((v) => Math.round(v)).join(",") : "/photos";
  let res;
  try {
    res = await fetch(url, { method: "POST", headers: h, body: file });
  } catch (err) {
    return { ok: false, reason: "cannot reach the server: " + err };
  }
  const body = await res.json().catch(() => ({}));
  // 422: a photo without one usable face: the user can frame it by hand
  if (!res.ok) return { ok: false, reason: body.error || res.statusText, face: res.status === 422 };
  return { ok: true, id: body.photo_id, faceBox: body.face_box || null };
}

// The framer: the photo on a canvas, and one face box in the photo's pixels,
// [x, y, w, h, angle]: the box turned `angle` degrees clockwise about its centre.
const framer = { image: null, scale: 1, box: null, drag: null };
const MAX_TILT = 45; // the server animates faces tilted up to this
const FIELDS = ["x", "y", "w", "h", "a"];
// what the page says when the server finds no face it can use: how to fix it, here
const FRAME_IT = "Drag a box around the face in your photo below, forehead to chin (turn it " +
  "with its round handle if the head is tilted), then press Connect again.";

// "Photo refused: " and the server's reason as a sentence; the page's fix on a line of its own
function refusal(reason, fix = "") {
  const said = String(reason).trim();
  return "Photo refused: " + said + (/[.!?]$/.test(said) ? "" : ".") + (fix ? "\n" + fix : "");
}

async function showFramer(box = null) {
  const file = $("photo").files[0];
  if (!file) return;
  if (!framer.image) {
    const img = new Image();
    img.src = URL.createObjectURL(file);
    await img.decode();
    framer.image = img;
  }
  const img = framer.image, canvas = $("framer-canvas");
  framer.scale = Math.min(1, 480 / img.naturalWidth, 480 / img.naturalHeight);
  canvas.width = Math.round(img.naturalWidth * framer.scale);
  canvas.height = Math.round(img.naturalHeight * framer.scale);
  if (box) setBox(box);
  $("framer").hidden = false;
  drawFramer();
  $("framer").scrollIntoView({ block: "nearest" });
}

function hideFramer() {
  if (framer.image) URL.revokeObjectURL(framer.image.src);
  framer.image = null;
  framer.box = framer.drag = null;
  $("framer").hidden = true;
  for (const k of FIELDS) $("box-" + k).value = "";
}

const clamp = (v, lo, hi) => (lo > hi ? (lo + hi) / 2 : Math.min(Math.max(v, lo), hi));
const radians = (deg) => (deg * Math.PI) / 180;
// a vector turned `deg` degrees clockwise on screen (y points down)
function turn([u, v], deg) {
  const c = Math.cos(radians(deg)), s = Math.sin(radians(deg));
  return [c * u - s * v, s * u + c * v];
}

function setBox(box) {
  const img = framer.image;
  if (!box || !img) { framer.box = null; } else {
    // whole pixels and degrees; the turned box inside the photo, as the server asks
    let [x, y, w, h, a = 0] = box.map((v) => Math.round(v || 0));
    const W = img.naturalWidth, H = img.naturalHeight;
    a = clamp(a, -MAX_TILT, MAX_TILT);
    w = Math.max(1, Math.min(w, W)); h = Math.max(1, Math.min(h, H));
    const c = Math.abs(Math.cos(radians(a))), s = Math.abs(Math.sin(radians(a)));
    const ex = Math.ceil((w * c + h * s) / 2), ey = Math.ceil((w * s + h * c) / 2);
    x = Math.round(clamp(x + w / 2, ex, W - ex) - w / 2);
    y = Math.round(clamp(y + h / 2, ey, H - ey) - h / 2);
    framer.box = [x, y, w, h, a];
  }
  const b = framer.box || ["", "", "", "", ""];
  FIELDS.forEach((k, i) => ($("box-" + k).value = b[i]));
  drawFramer();
}

// the box's centre, and a photo point in the box's own frame (relative to its centre)
function boxCentre(b) {
  return [b[0] + b[2] / 2, b[1] + b[3] / 2];
}
function inBox(b, px, py) {
  const [cx, cy] = boxCentre(b);
  return turn([px - cx, py - cy], -b[4]);
}

function drawFramer() {
  const canvas = $("framer-canvas"), ctx = canvas.getContext("2d");
  if (!framer.image) return;
  ctx.drawImage(framer.image, 0, 0, canvas.width, canvas.height);
  if (!framer.box) return;
  const [x, y, w, h] = framer.box.map((v) => v * framer.scale);
  ctx.save();
  ctx.translate(x + w / 2, y + h / 2);
  ctx.rotate(radians(framer.box[4])); // clockwise, as the box's angle
  ctx.lineWidth = 2;
  ctx.strokeStyle = ctx.fillStyle = "#4cf";
  ctx.strokeRect(-w / 2, -h / 2, w, h);
  ctx.fillRect(w / 2 - 6, h / 2 - 6, 12, 12); // the resize handle
  ctx.beginPath(); // the tilt handle, on the top edge: "up" for the face
  ctx.arc(0, -h / 2, 7, 0, 2 * Math.PI);
  ctx.fill();
  ctx.restore();
}

// a pointer event's position in the photo's pixels
function photoPoint(e) {
  const rect = $("framer-canvas").getBoundingClientRect();
  const k = $("framer-canvas").width / rect.width / framer.scale;
  return [(e.clientX - rect.left) * k, (e.clientY - rect.top) * k];
}

function onPointerDown(e) {
  if (!framer.image) return;
  const [px, py] = photoPoint(e), b = framer.box, grab = 10 / framer.scale;
  const [u, v] = b ? inBox(b, px, py) : [0, 0]; // in the box's frame
  if (b && Math.hypot(u, v + b[3] / 2) < grab) {
    framer.drag = { mode: "tilt" };
  } else if (b && Math.abs(u - b[2] / 2) < grab && Math.abs(v - b[3] / 2) < grab) {
    // the top-left corner stays where it is, in the photo
    const [cx, cy] = boxCentre(b), [tx, ty] = turn([-b[2] / 2, -b[3] / 2], b[4]);
    framer.drag = { mode: "resize", x0: cx + tx, y0: cy + ty };
  } else if (b && Math.abs(u) < b[2] / 2 && Math.abs(v) < b[3] / 2) {
    framer.drag = { mode: "move", dx: px - b[0], dy: py - b[1] };
  } else {
    framer.drag = { mode: "draw", x0: px, y0: py };
  }
  $("framer-canvas").setPointerCapture(e.pointerId);
}

function onPointerMove(e) {
  const d = framer.drag;
  if (!d) return;
  const [px, py] = photoPoint(e);
  const b = framer.box;
  if (d.mode === "move") {
    setBox([px - d.dx, py - d.dy, b[2], b[3], b[4]]);
    return;
  }
  if (d.mode === "tilt") { // the handle points from the centre to the pointer
    const [cx, cy] = boxCentre(b);
    const a = (Math.atan2(px - cx, cy - py) * 180) / Math.PI;
    setBox([b[0], b[1], b[2], b[3], a]);
    return;
  }
  if (d.mode === "resize") { // square, from the fixed corner along the box's own axes
    const [u, v] = turn([px - d.x0, py - d.y0], -b[4]);
    const side = Math.max(Math.abs(u), Math.abs(v), 1);
    const [ox, oy] = turn([side / 2, side / 2], b[4]);
    setBox([d.x0 + ox - side / 2, d.y0 + oy - side / 2, side, side, b[4]]);
    return;
  }
  // a new box: square, as a face box is, and upright
  const side = Math.max(Math.abs(px - d.x0), Math.abs(py - d.y0));
  const x = px < d.x0 ? d.x0 - side : d.x0;
  const y = py < d.y0 ? d.y0 - side : d.y0;
  setBox([x, y, side, side, 0]);
}

function onPointerUp() {
  framer.drag = null;
}

function onBoxField() {
  const v = FIELDS.map((k) => Number($("box-" + k).value)); // an empty angle is 0
  if (v.every((n) => Number.isFinite(n)) && v[2] > 0 && v[3] > 0) setBox(v);
}

// "Frame the face": the photo with the box the server finds, to adjust (or none to draw)
async function frameByHand() {
  framer.box = null;
  say("Looking for the face…");
  const photo = await uploadPhoto();
  await showFramer(photo.ok ? photo.faceBox : null);
  if (photo.ok) say("Adjust the box if it is not around the face (or not tilted with it), then press Connect.");
  else say(refusal(photo.reason, photo.face ? FRAME_IT : ""), "error");
}

async function connect() {
  setState("connecting");
  say("Checking your photo…");
  const photo = await uploadPhoto();
  if (!photo.ok) {
    setState("error");
    if (photo.face && !framer.box) {
      await showFramer();
      say(refusal(photo.reason, FRAME_IT), "error");
    } else {
      say(refusal(photo.reason), "error");
    }
    return;
  }
  say("Asking for the microphone…");
  try {
    micStream = await navigator.mediaDevices.getUserMedia({ audio: true, video: false });
  } catch (err) {
    setState("error");
    say("Microphone access was denied. Allow it in the browser's site settings and try again.", "error");
    return;
  }
  pc = new RTCPeerConnection({ iceServers: [] });
  for (const track of micStream.getAudioTracks()) pc.addTrack(track, micStream);
  pc.addTransceiver("video", { direction: "recvonly" });
  channel = pc.createDataChannel("facecast");
  channel.onmessage = (e) => onEvent(JSON.parse(e.data));
  const remote = new MediaStream();
  pc.ontrack = (e) => {
    remote.addTrack(e.track);
    $("avatar").srcObject = remote;
  };
  pc.onconnectionstatechange = () => {
    if (!pc) return;
    // "disconnected" can heal by itself (a network blip); "failed" does not.
    if (pc.connectionState === "disconnected") say("Connection interrupted, waiting…", "warn");
    if (pc.connectionState === "connected" && stats.state === "connected") say("Connected.");
    if (pc.connectionState === "failed") {
      say("Connection lost. Press Connect to start again.", "error");
      disconnect(false);
    }
  };
  await pc.setLocalDescription(await pc.createOffer());
  await iceGathered(pc);
  say("Connecting…");
  let res;
  try {
    res = await fetch("/offer", {
      method: "POST", headers: headers(),
      body: JSON.stringify(Object.assign(
        { sdp: pc.localDescription.sdp, type: pc.localDescription.type },
        photo.id ? { photo_id: photo.id } : {},
      )),
    });
  } catch (err) {
    say("Cannot reach the server: " + err, "error");
    return disconnect(false);
  }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    const reason = body.error || res.statusText;
    if (res.status === 401) say("The token was refused: enter the server's token. (" + reason + ")", "error");
    else if (res.status === 503) say("The server is full right now; try again in a minute. (" + reason + ")", "error");
    else say("The server refused the call: " + reason, "error");
    return disconnect(false);
  }
  sessionId = stats.sessionId = body.session_id;
  connectStart = performance.now();
  await pc.setRemoteDescription(body);
  setState("connected");
  say("Connected: speak, and the avatar says it back.");
  watchFirstFrame();
  statsTimer = setInterval(pollStats, 500);
}

function iceGathered(peer) {
  if (peer.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => peer.iceGatheringState === "complete" && resolve();
    peer.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, 2000); // host candidates are enough on a LAN
  });
}

function watchFirstFrame() {
  const video = $("avatar");
  const onFrame = () => {
    if (stats.ttffMs === null && video.videoWidth > 0) {
      stats.ttffMs = Math.round(performance.now() - connectStart);
      render();
    }
  };
  if ("requestVideoFrameCallback" in video) video.requestVideoFrameCallback(onFrame);
  else video.addEventListener("loadeddata", onFrame, { once: true });
}

async function pollStats() {
  if (!pc) return;
  const report = await pc.getStats();
  report.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "video") {
      const frames = s.framesDecoded || 0;
      const now = s.timestamp;
      if (lastTs) stats.fps = Math.round(((frames - lastFrames) * 1000) / (now - lastTs) * 10) / 10;
      if (lastTs) stats.kbps = Math.round(((s.bytesReceived - lastBytes) * 8) / (now - lastTs));
      lastFrames = frames; lastTs = now; lastBytes = s.bytesReceived;
      stats.framesDecoded = frames;
      stats.statsAtMs = Math.round(now); // when framesDecoded was read (for rates)
      stats.freezeCount = s.freezeCount || 0;
    }
    if (s.type === "candidate-pair" && s.nominated && s.currentRoundTripTime !== undefined) {
      stats.rttMs = Math.round(s.currentRoundTripTime * 1000);
    }
  });
  render();
}

function onEvent(msg) {
  if (msg.type === "stats") {  // once a second: shown, not logged
    stats.freshShare = msg.fresh_share === null ? null : (100 * msg.fresh_share).toFixed(1) + " %";
    stats.speechToLipsMs = msg.speech_to_lips_p50_ms;
    stats.playoutDelayMs = msg.playout_delay_now_ms;
    stats.engineFps = msg.engine_fps;
    if (msg.below_real_time && !stats.belowRealTime) {
      // said once: the playout stays in sync at the engine's own rate (it holds a frame
      // where the engine could not make one in time) instead of showing late frames
      say("This server makes " + msg.engine_fps + " frames a second, below the video's 25: " +
          "the avatar stays in sync with its speech and holds a frame where it cannot keep up.",
          "warn");
    }
    stats.belowRealTime = Boolean(msg.below_real_time);
    render();
    return;
  }
  logEvent(msg);
  if (msg.type === "speech_started") stats.speaking = true;
  if (msg.type === "speech_stopped") stats.speaking = false;
  if (msg.type === "error") say("Server error: " + msg.message, "error");
  if (msg.type === "session_closed") {
    say("The server ended the call (" + msg.reason + "). Press Connect to start again.", "error");
    disconnect(false);
    return;
  }
  render();
}

async function disconnect(release = true) {
  clearInterval(statsTimer);
  if (release && sessionId) {
    fetch("/sessions/" + sessionId, { method: "DELETE", headers: headers() }).catch(() => {});
  }
  // Our own DELETE makes the server send session_closed; a message already on its way
  // must not turn this hang-up into "the server ended the call".
  if (channel) channel.onmessage = null;
  if (pc) pc.close();
  if (micStream) micStream.getTracks().forEach((t) => t.stop());
  pc = channel = micStream = null;
  sessionId = null;
  lastTs = lastBytes = lastFrames = 0;
  // A hang-up the user asked for is "idle"; anything else ended the call with an error.
  setState(release ? "idle" : "error");
  if (release) say("Disconnected.");
}

function toggleMic() {
  if (!micStream) return;
  const on = $("mic").getAttribute("aria-pressed") !== "true";
  // A disabled track still sends silence, so the avatar keeps moving (idle) and the
  // server keeps the session.
  micStream.getAudioTracks().forEach((t) => (t.enabled = on));
  $("mic").setAttribute("aria-pressed", String(on));
  $("mic").textContent = on ? "Mic on" : "Mic off";
}

function interrupt() {
  if (channel && channel.readyState === "open") channel.send(JSON.stringify({ type: "interrupt" }));
}

$("connect").onclick = () => { stats.error = null; stats.ttffMs = null; connect(); };
$("disconnect").onclick = () => disconnect(true);
$("mic").onclick = toggleMic;
$("interrupt").onclick = interrupt;
$("photo").onchange = () => { hideFramer(); $("frame").disabled = !$("photo").files[0]; };
$("frame").onclick = frameByHand;
$("box-clear").onclick = () => setBox(null);
$("framer-canvas").addEventListener("pointerdown", onPointerDown);
$("framer-canvas").addEventListener("pointermove", onPointerMove);
$("framer-canvas").addEventListener("pointerup", onPointerUp);
for (const k of FIELDS) $("box-" + k).addEventListener("change", onBoxField);
window.addEventListener("beforeunload", () => disconnect(true));
render();
if (params.get("autostart") === "1") connect();
