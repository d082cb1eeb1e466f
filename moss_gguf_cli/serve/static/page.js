// The page of `moss-gguf serve`: plain script, no framework, nothing fetched from elsewhere.
//
// Speak with format "wav" at speed 1 asks for server-sent events (stream_format "sse") and
// plays each audio delta through Web Audio as it arrives; when the stream ends, the <audio>
// player gets a WAV of everything that arrived, to play again or save. Other formats and
// speeds cannot stream (the server changes the tempo of the whole utterance; mp3 and the like
// come whole), so they are fetched whole and played in the <audio> player.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "moss-gguf.api-key";
  const LEAD_S = 0.05; // scheduling margin before the first streamed buffer
  const state = {
    model: null, keyRequired: false, run: null, ctx: null, audioUrl: null, audioBlob: null,
  };
  // timings of each Speak, for the curious (and the browser tests)
  const runs = [];
  window.mossPage = { runs, state };

  // ------------------------------------------------------------------ API
  class ApiFailure extends Error {
    constructor(status, message, param, code) {
      super(message);
      this.status = status;
      this.param = param;
      this.code = code;
    }
  }

  const apiKey = () => localStorage.getItem(KEY_STORE) || "";

  function withKey(headers) {
    const out = Object.assign({}, headers || {});
    if (apiKey()) out.Authorization = "Bearer " + apiKey();
    return out;
  }

  async function failure(res) {
    let message = res.statusText || "request failed";
    let param = null;
    let code = null;
    try {
      const body = await res.json();
      if (body && body.error) {
        message = body.error.message || message;
        param = body.error.param || null;
        code = body.error.code || null;
      }
    } catch (_) { /* not JSON: the status line says it */ }
    return new ApiFailure(res.status, message, param, code);
  }

  async function api(path, options) {
    const opts = Object.assign({}, options || {});
    opts.headers = withKey(opts.headers);
    const res = await fetch(path, opts);
    if (!res.ok) throw await failure(res);
    return res;
  }

  // ------------------------------------------------------------------ status and progress
  function say(text, kind) {
    const el = $("status");
    el.textContent = text;
    el.className = kind || "";
  }

  function oneLine(err) {
    if (err instanceof ApiFailure) {
      return `Error ${err.status}: ${err.message}` + (err.param ? ` (param: ${err.param})` : "");
    }
    return "Error: " + (err && err.message ? err.message : String(err));
  }

  function showError(err) {
    say(oneLine(err), "error");
    if (err instanceof ApiFailure && err.status === 401) showKeyForm(true);
  }

  const progress = (text) => { $("progress").textContent = text; };
  const seconds = (s) => `${s.toFixed(1)} s`;

  // ------------------------------------------------------------------ key, model, lists
  function showKeyForm(show) {
    $("key-form").hidden = !show;
    if (show) $("api-key").value = apiKey();
  }

  async function start() {
    try {
      const config = await (await fetch("/ui/config")).json();
      state.keyRequired = Boolean(config.api_key_required);
    } catch (_) { /* an older server: find out from the first 401 */ }
    showKeyForm(state.keyRequired);
    if (state.keyRequired && !apiKey()) {
      say("This server needs an API key: enter it above.");
      $("api-key").focus();
      return;
    }
    await connect();
  }

  async function connect() {
    try {
      const models = await (await api("/v1/models")).json();
      state.model = models.data[0].id;
      showAdapters(models.data[0].lora || []);
      await Promise.all([loadVoices(), loadLanguages()]);
      say(`Ready: model ${state.model}.`, "ok");
    } catch (err) {
      showError(err);
    }
  }

  async function loadVoices(select) {
    const body = await (await api("/v1/audio/voices")).json();
    const voice = $("voice");
    const keep = select || voice.value;
    voice.replaceChildren(new Option("default", "default")); // the model's own voice
    const list = $("voice-list");
    list.replaceChildren();
    for (const v of body.data) {
      voice.add(new Option(v.name, v.name));
      list.append(voiceItem(v));
    }
    if (!body.data.length) {
      const li = document.createElement("li");
      li.className = "about";
      li.textContent = "No voices registered yet: add one from a clip below.";
      list.append(li);
    }
    voice.value = [...voice.options].some((o) => o.value === keep) ? keep : "default";
  }

  function voiceItem(v) {
    const li = document.createElement("li");
    const about = document.createElement("span");
    const name = document.createElement("strong");
    name.textContent = v.name;
    about.append(name, ` · ${seconds(v.seconds)}` + (v.text ? ` · “${v.text}”` : ""));
    about.className = "about";
    const del = document.createElement("button");
    del.type = "button";
    del.textContent = "Delete";
    del.setAttribute("aria-label", `Delete voice ${v.name}`);
    del.dataset.testid = "voice-delete";
    del.addEventListener("click", () => deleteVoice(v.name));
    li.append(about, del);
    return li;
  }

  async function loadLanguages() {
    const field = $("language-field");
    const select = $("language");
    const res = await fetch("/v1/audio/languages", { headers: withKey() });
    if (res.status === 404) { // this server takes no language: the model guesses
      select.disabled = true;
      field.hidden = true;
      return;
    }
    if (!res.ok) throw await failure(res);
    const body = await res.json(); // {"languages": [...]} or OpenAI's list form {"data": [...]}
    const names = (body.languages || body.data || []).map((x) =>
      typeof x === "string" ? x : x.name || x.code || x.id);
    select.replaceChildren(new Option("auto", "auto"));
    for (const name of names) if (name && name !== "auto") select.add(new Option(name, name));
    select.disabled = false;
    field.hidden = false;
  }

  function showAdapters(names) {
    // the adapters `serve --lora NAME=FILE` loaded (GET /v1/models' `lora`); none: no picker
    const select = $("lora");
    const keep = select.value;
    select.replaceChildren(new Option("none", ""));
    for (const name of names) select.add(new Option(name, name));
    select.value = names.includes(keep) ? keep : "";
    select.disabled = !names.length;
    $("lora-field").hidden = !names.length;
    $("lora-scale-field").hidden = !names.length;
    loraChosen();
  }

  function loraChosen() {
    $("lora-scale").disabled = !$("lora").value; // a scale means nothing without an adapter
  }

  function loraField() {
    // the request's `lora` field: {NAME: scale}, or nothing when no adapter is picked
    const name = $("lora").disabled ? "" : $("lora").value;
    if (!name) return null;
    // the form refuses an off-range or off-step value before this; a backstop for the rest
    const text = $("lora-scale").value.trim();
    const scale = Number(text);
    if (!text || !Number.isFinite(scale) || Math.abs(scale) > 16) {
      throw new Error("the adapter scale must be a number from -16 to 16");
    }
    return { [name]: scale };
  }

  // ------------------------------------------------------------------ voices
  async function addVoice(event) {
    event.preventDefault();
    const name = $("voice-name").value.trim();
    const file = $("voice-file").files[0];
    const text = $("voice-text").value.trim();
    const form = new FormData();
    form.append("name", name);
    if (file) form.append("file", file, file.name);
    if (text) form.append("text", text);
    $("voice-add").disabled = true;
    say(`Registering voice ${name}…`);
    try {
      try {
        await api("/v1/audio/voices", { method: "POST", body: form });
      } catch (err) {
        // the server never overwrites a voice unasked: ask the user, then say so
        if (!(err instanceof ApiFailure && err.code === "voice_exists")) throw err;
        if (!window.confirm(`Voice ${name} exists. Replace its clip and text?`)) {
          say(`Voice ${name} kept as it was.`);
          return;
        }
        form.append("replace", "true");
        await api("/v1/audio/voices", { method: "POST", body: form });
      }
      await loadVoices(name);
      $("voice-form").reset();
      say(`Voice ${name} registered and selected.`, "ok");
    } catch (err) {
      showError(err);
    } finally {
      $("voice-add").disabled = false;
    }
  }

  async function deleteVoice(name) {
    if (!window.confirm(`Delete voice ${name}?`)) return;
    try {
      await api(`/v1/audio/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
      await loadVoices();
      say(`Voice ${name} deleted.`, "ok");
    } catch (err) {
      showError(err);
    }
  }

  // ------------------------------------------------------------------ audio
  function wavParts(bytes) {
    // the stream's first delta starts with a WAV header: the rate, and where samples start
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let rate = 24000;
    let channels = 1; // MOSS-TTS-Nano speaks 48 kHz stereo
    let at = 12;
    while (at + 8 <= bytes.length) {
      const id = String.fromCharCode(...bytes.subarray(at, at + 4));
      const size = view.getUint32(at + 4, true);
      if (id === "fmt ") {
        channels = view.getUint16(at + 10, true);
        rate = view.getUint32(at + 12, true);
      }
      if (id === "data") return { rate, channels, start: at + 8 };
      at += 8 + size;
    }
    throw new Error("the stream's WAV header has no data chunk");
  }

  function wavBlob(chunks, rate, channels = 1) {
    const n = chunks.reduce((sum, c) => sum + c.length, 0);
    const head = new DataView(new ArrayBuffer(44));
    const text = (at, s) => [...s].forEach((ch, i) => head.setUint8(at + i, ch.charCodeAt(0)));
    text(0, "RIFF"); head.setUint32(4, 36 + 2 * n, true); text(8, "WAVE");
    text(12, "fmt "); head.setUint32(16, 16, true); head.setUint16(20, 1, true);
    head.setUint16(22, channels, true); head.setUint32(24, rate, true);
    head.setUint32(28, 2 * channels * rate, true); head.setUint16(32, 2 * channels, true);
    head.setUint16(34, 16, true);
    text(36, "data"); head.setUint32(40, 2 * n, true);
    return new Blob([head, ...chunks], { type: "audio/wav" });
  }

  function setPlayerSource(blob) {
    if (state.audioUrl) URL.revokeObjectURL(state.audioUrl);
    state.audioBlob = blob; // what the player holds, readable without a fetch (tests)
    state.audioUrl = URL.createObjectURL(blob);
    $("audio").src = state.audioUrl;
  }

  class StreamPlayer {
    // Plays 16-bit chunks (channels interleaved) back to back through Web Audio as they arrive.
    constructor(ctx, rate, channels = 1) {
      this.ctx = ctx;
      this.rate = rate;
      this.channels = channels;
      this.next = 0;
      this.firstAt = null; // context time the first buffer starts
      this.sources = [];
      this.chunks = [];
      this.carry = null; // bytes of a part sample left over between deltas
    }

    push(bytes) {
      if (this.carry) {
        const joined = new Uint8Array(bytes.length + this.carry.length);
        joined.set(this.carry);
        joined.set(bytes, this.carry.length);
        bytes = joined;
        this.carry = null;
      }
      const frameBytes = 2 * this.channels; // a whole sample of every channel
      const rest = bytes.length % frameBytes;
      if (rest) {
        this.carry = bytes.slice(bytes.length - rest);
        bytes = bytes.subarray(0, bytes.length - rest);
      }
      if (!bytes.length) return;
      const ints = new Int16Array(bytes.slice().buffer);
      this.chunks.push(ints);
      const frames = ints.length / this.channels;
      const buffer = this.ctx.createBuffer(this.channels, frames, this.rate);
      for (let c = 0; c < this.channels; c++) {
        const floats = new Float32Array(frames);
        for (let i = 0; i < frames; i++) floats[i] = ints[i * this.channels + c] / 32768;
        buffer.copyToChannel(floats, c);
      }
      const source = this.ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(this.ctx.destination);
      const at = Math.max(this.next, this.ctx.currentTime + LEAD_S);
      source.start(at);
      this.next = at + buffer.duration;
      if (this.firstAt === null) this.firstAt = at;
      this.sources.push(source);
    }

    received() {
      return this.chunks.reduce((s, c) => s + c.length, 0) / this.channels / this.rate;
    }

    played() { return this.firstAt === null ? 0 : Math.max(0, this.ctx.currentTime - this.firstAt); }

    stop() { for (const s of this.sources) try { s.stop(); } catch (_) { /* not started */ } }
  }

  function chunkOf(event) {
    // which chunk of a long text this event carries, when the server says (i of n)
    const c = event.chunk;
    if (c && typeof c === "object") return [c.index ?? c.i, c.count ?? c.total ?? c.n];
    if (c !== undefined && event.chunks !== undefined) return [c, event.chunks];
    if (event.chunk_index !== undefined) {
      return [event.chunk_index + 1, event.chunk_count ?? event.num_chunks];
    }
    return null;
  }

  function runaways(event) {
    // chunks of a long text that ran to their budget (a list of chunk numbers, or a count)
    const r = event.runaways;
    return Array.isArray(r) ? r.length : Number(r) || 0;
  }

  function events(text) {
    // complete SSE blocks in TEXT → [parsed events, the unfinished rest]
    const blocks = text.split(/\r?\n\r?\n/);
    const rest = blocks.pop();
    const out = [];
    for (const block of blocks) {
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (data) out.push(JSON.parse(data));
    }
    return [out, rest];
  }

  async function streamSpeech(run, body) {
    body.response_format = "wav";
    body.stream_format = "sse";
    progress("Waiting for the first sound (the server answers once it is made)…");
    const res = await api("/v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: run.abort.signal,
    });
    run.headersAt = performance.now();
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    let player = null;
    run.stopAudio = () => player && player.stop();
    let finished = false;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let batch;
      [batch, pending] = events(pending + decoder.decode(value, { stream: true }));
      for (const event of batch) {
        if (event.type === "speech.audio.delta") {
          let bytes = Uint8Array.from(atob(event.audio), (ch) => ch.charCodeAt(0));
          if (!player) {
            const { rate, channels, start } = wavParts(bytes);
            player = new StreamPlayer(state.ctx, rate, channels);
            bytes = bytes.subarray(start);
          }
          player.push(bytes);
          run.deltas += 1;
          if (run.firstSoundAt === null) {
            run.firstSoundAt = performance.now() + 1000 * (player.firstAt - state.ctx.currentTime);
          }
          const part = chunkOf(event);
          run.runaways = runaways(event);
          progress(`Playing as it streams: ${seconds(player.received())} received` +
            (part ? ` · chunk ${part[0]} of ${part[1]}` : "") +
            (run.runaways ? ` · ${run.runaways} ran away (their audio may be cut)` : ""));
        } else if (event.type === "speech.audio.done") {
          finished = true;
          if (event.runaways !== undefined) run.runaways = runaways(event);
        } else if (event.error) {
          throw new ApiFailure(event.error.status || 500, event.error.message, event.error.param);
        }
      }
    }
    run.responseEndAt = performance.now();
    if (!player) throw new Error("the server sent no audio");
    run.playedBeforeEnd = player.played();
    run.seconds = player.received();
    progress(`Streamed ${seconds(run.seconds)} of audio in ${run.deltas} pieces; ` +
      "the player below holds it to play again or save.");
    setPlayerSource(wavBlob(player.chunks, player.rate, player.channels));
    if (!finished) throw new Error(`the stream ended early, after ${seconds(run.seconds)} of audio`);
  }

  async function wholeSpeech(run, body, format) {
    body.response_format = format;
    progress(`Making the whole ${format} file first (only wav at speed 1 streams)…`);
    const res = await api("/v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: run.abort.signal,
    });
    run.headersAt = performance.now();
    const blob = await res.blob();
    run.responseEndAt = performance.now();
    setPlayerSource(blob);
    progress(`Received the whole ${format} file.`);
    try {
      await $("audio").play();
    } catch (err) { // the browser wants a press on the player first
      if (err.name !== "NotAllowedError") throw err;
      progress(`Received the whole ${format} file: press play to hear it.`);
    }
    run.firstSoundAt = performance.now();
    run.playedBeforeEnd = 0;
  }

  function audioContext() {
    // made (or woken) inside the click, which is what lets a browser play sound
    if (!state.ctx) state.ctx = new AudioContext();
    if (state.ctx.state === "suspended") state.ctx.resume();
    return state.ctx;
  }

  function stopRun() {
    const run = state.run;
    if (!run) return;
    run.abort.abort();
    if (run.stopAudio) run.stopAudio();
    $("audio").pause();
  }

  function setBusy(busy) {
    $("speak").disabled = busy;
    $("stop").disabled = !busy;
  }

  async function speak(event) {
    event.preventDefault();
    stopRun();
    const format = $("format").value;
    const speed = Number($("speed").value);
    const body = { model: state.model || "tts-1", input: $("text").value, voice: $("voice").value };
    const language = $("language");
    if (!language.disabled && language.value !== "auto") body.language = language.value;
    if (speed !== 1) body.speed = speed;
    const streams = format === "wav" && speed === 1;
    if (streams) audioContext();
    const run = {
      abort: new AbortController(), startedAt: performance.now(), headersAt: null,
      firstSoundAt: null, responseEndAt: null, playedBeforeEnd: null, deltas: 0, seconds: null,
      streamed: streams, error: null, stopped: false, runaways: 0,
    };
    state.run = run;
    runs.push(run);
    setBusy(true);
    say("Speaking…");
    try {
      const lora = loraField();
      if (lora) body.lora = lora;
      run.lora = lora;
      await (streams ? streamSpeech(run, body) : wholeSpeech(run, body, format));
      const first = (run.firstSoundAt - run.startedAt) / 1000;
      const made = (run.responseEndAt - run.startedAt) / 1000;
      say(`Done: first sound after ${seconds(first)}, the server finished after ` +
        `${seconds(made)}.` + (run.runaways ? ` ${run.runaways} chunk(s) ran away: their ` +
        "audio may be cut." : ""), "ok");
    } catch (err) {
      run.error = oneLine(err);
      run.stopped = err.name === "AbortError";
      if (state.run !== run) return; // a newer Speak took over: its lines are the ones to show
      if (!run.deltas && !run.responseEndAt) progress("");
      if (err.name === "AbortError") say("Stopped.");
      else showError(err);
    } finally {
      run.done = true;
      if (state.run === run) setBusy(false);
    }
  }

  // ------------------------------------------------------------------ wiring
  function saveKey(event) {
    event.preventDefault();
    localStorage.setItem(KEY_STORE, $("api-key").value.trim());
    say("Key saved in this browser; connecting…");
    connect();
  }

  function forgetKey() {
    localStorage.removeItem(KEY_STORE);
    $("api-key").value = "";
    say("Key forgotten.");
  }

  function countChars() {
    const n = $("text").value.length;
    $("count").textContent = `${n} character${n === 1 ? "" : "s"}`;
  }

  $("speak-form").addEventListener("submit", speak);
  $("stop").addEventListener("click", stopRun);
  $("lora").addEventListener("change", loraChosen);
  $("voice-form").addEventListener("submit", addVoice);
  $("key-form").addEventListener("submit", saveKey);
  $("key-forget").addEventListener("click", forgetKey);
  $("text").addEventListener("input", countChars);
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      $("speak-form").requestSubmit();
    }
  });
  start();
})();
